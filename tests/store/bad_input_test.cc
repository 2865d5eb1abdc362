// Bad input gets a clear error: through ferry::Store, and as raw, malformed
// gRPC requests sent with the generated stub. The master keeps serving.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/store.grpc.pb.h"
#include "store_cluster.h"

namespace ferry::test {
namespace {

namespace pb = ::ferry::store::v1;

class BadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto c = StartCluster(1, "16MiB", {"--max-object-size", "8MiB"});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = new Cluster(std::move(c).value());
    auto s = Client(cluster_->master.address);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = s.value().release();
    stub_ = pb::Master::NewStub(
                grpc::CreateChannel(cluster_->master.address, grpc::InsecureChannelCredentials()))
                .release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete store_;
    delete cluster_;
  }
  static std::unique_ptr<grpc::ClientContext> Ctx() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return ctx;
  }
  static Cluster* cluster_;
  static Store* store_;
  static pb::Master::Stub* stub_;
};
Cluster* BadInput::cluster_ = nullptr;
Store* BadInput::store_ = nullptr;
pb::Master::Stub* BadInput::stub_ = nullptr;

TEST_F(BadInput, KeysAndSizesThroughTheClient) {
  auto v = Pattern(100, 1);
  EXPECT_EQ(store_->Put("", v).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Put(std::string(Store::kMaxKeyBytes + 1, 'k'), v).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->Put(std::string(Store::kMaxKeyBytes, 'k'), v).ok());
  EXPECT_EQ(store_->Put("empty", std::span<const uint8_t>()).code(), StatusCode::kInvalidArgument);
  auto big = Pattern((8 << 20) + 1, 2);
  Status st = store_->Put("big", big);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_EQ(store_->Get("unknown").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Get("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Exists("unknown").code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->Remove("unknown").code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->Put("dup", v).ok());
  EXPECT_EQ(store_->Put("dup", v).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store_->Pin("unknown", StorePin::kHard).code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->Pin("dup", StorePin::kSoft, std::chrono::seconds(5)).ok());
  EXPECT_TRUE(store_->Pin("dup", StorePin::kNone).ok());
  // A batch reports each item on its own.
  std::vector<std::string> keys = {"dup", "", "unknown"};
  auto got = store_->BatchGet(keys);
  EXPECT_TRUE(got[0].ok());
  EXPECT_EQ(got[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(got[2].status().code(), StatusCode::kNotFound);
}

TEST_F(BadInput, BuffersThroughTheClient) {
  auto v = Pattern(4096, 3);
  ASSERT_TRUE(store_->Put("buf", v).ok());
  std::vector<uint8_t> small(100), unregistered(8192);
  ASSERT_TRUE(store_->RegisterBuffer(small.data(), small.size()).ok());
  EXPECT_EQ(store_->GetInto("buf", {small.data(), small.size()}).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(store_->GetInto("buf", {unregistered.data(), unregistered.size()}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->PutFrom("buf2", {unregistered.data(), unregistered.size()}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Exists("buf2").code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->UnregisterBuffer(small.data()).ok());
}

TEST_F(BadInput, MalformedBatchesAreRefusedAsAWhole) {
  pb::KeysRequest empty;
  pb::GetResponse resp;
  auto st = stub_->Get(Ctx().get(), empty, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  pb::KeysRequest huge;
  const std::string k = "k";
  for (int i = 0; i < 4097; ++i) *huge.add_keys() = k;
  pb::ExistsResponse er;
  st = stub_->Exists(Ctx().get(), huge, &er);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  pb::PutEndRequest no_items;
  pb::StatusesResponse sr;
  EXPECT_EQ(stub_->PutEnd(Ctx().get(), no_items, &sr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(BadInput, MalformedItemsGetPerItemErrors) {
  pb::PutBeginRequest req;
  auto add = [&](const std::string& key, uint64_t size, uint32_t replicas, int pin) {
    auto* it = req.add_items();
    it->set_key(key);
    it->set_size(size);
    it->set_replicas(replicas);
    it->set_pin(static_cast<pb::PinKind>(pin));
  };
  add("", 10, 1, 0);                      // missing key
  add("k0", 0, 1, 0);                     // missing size
  add("k1", ~0ull, 1, 0);                 // absurd size
  add("k2", 10, 1000, 0);                 // absurd replica count
  add("k3", 10, 1, 77);                   // unknown enum value
  add(std::string(5000, 'x'), 10, 1, 0);  // key too long
  add("k4", 10, 2, 0);                    // more replicas than nodes
  add("fine", 10, 1, 0);
  pb::PutBeginResponse resp;
  ASSERT_TRUE(stub_->PutBegin(Ctx().get(), req, &resp).ok());
  ASSERT_EQ(resp.results_size(), req.items_size());
  for (int i = 0; i < 7; ++i) {
    // Too few nodes for the replicas is a state of the cluster, not an
    // error of the caller's: Unavailable, which a retry may get past.
    const StatusCode want = i == 6 ? StatusCode::kUnavailable : StatusCode::kInvalidArgument;
    EXPECT_EQ(resp.results(i).status().code(), static_cast<uint32_t>(want))
        << i << ": " << resp.results(i).status().message();
    EXPECT_FALSE(resp.results(i).status().message().empty());
  }
  EXPECT_EQ(resp.results(7).status().code(), 0u);
  // Ending it with a wrong id, then the right one.
  pb::PutEndRequest end;
  auto* e = end.add_items();
  e->set_key("fine");
  e->set_put_id(resp.results(7).put_id() + 12345);
  e->set_commit(true);
  auto* e2 = end.add_items();
  e2->set_key("fine");
  e2->set_put_id(resp.results(7).put_id());
  e2->set_commit(false);
  pb::StatusesResponse sr;
  ASSERT_TRUE(stub_->PutEnd(Ctx().get(), end, &sr).ok());
  EXPECT_EQ(sr.results(0).code(), static_cast<uint32_t>(StatusCode::kNotFound));
  EXPECT_EQ(sr.results(1).code(), 0u);
  pb::PinRequest pin;
  auto* p = pin.add_items();
  p->set_key("dup");
  p->set_kind(static_cast<pb::PinKind>(9));
  ASSERT_TRUE(stub_->Pin(Ctx().get(), pin, &sr).ok());
  EXPECT_EQ(sr.results(0).code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
}

TEST_F(BadInput, MalformedMountsAndHeartbeats) {
  pb::MountResponse mr;
  pb::MountRequest none;
  none.set_node("x:1");
  none.set_epoch(1);
  ASSERT_TRUE(stub_->Mount(Ctx().get(), none, &mr).ok());
  EXPECT_EQ(mr.status().code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
  pb::MountRequest wrap;
  wrap.set_node("x:1");
  wrap.set_epoch(1);
  auto* r = wrap.add_regions();
  r->set_base(~0ull - 10);
  r->set_size(1 << 20);
  ASSERT_TRUE(stub_->Mount(Ctx().get(), wrap, &mr).ok());
  EXPECT_EQ(mr.status().code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
  pb::MountRequest noname;
  noname.set_epoch(1);
  auto* r2 = noname.add_regions();
  r2->set_base(1 << 30);
  r2->set_size(1 << 20);
  ASSERT_TRUE(stub_->Mount(Ctx().get(), noname, &mr).ok());
  EXPECT_EQ(mr.status().code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
  pb::MountRequest noepoch;  // a node must say which process its addresses belong to
  noepoch.set_node("x:1");
  *noepoch.add_regions() = *r2;
  ASSERT_TRUE(stub_->Mount(Ctx().get(), noepoch, &mr).ok());
  EXPECT_EQ(mr.status().code(), static_cast<uint32_t>(StatusCode::kInvalidArgument));
  // Catalog entries that do not hold up are left out; the mount stands.
  pb::NodeResponse nr0;
  pb::MountRequest junk;
  junk.set_node("y:1");
  junk.set_epoch(1);
  junk.set_resumed(true);
  *junk.add_regions() = *r2;
  auto bad_entry = [&](const std::string& key, uint64_t size, uint64_t base, uint64_t len) {
    auto* e = junk.add_catalog();
    e->set_key(key);
    e->set_size(size);
    auto* x = e->add_extents();
    x->set_base(base);
    x->set_size(len);
    e->set_term(0);
  };
  bad_entry("", 100, r2->base(), 100);                      // no key
  bad_entry("short", 100, r2->base(), 50);                  // extents do not cover it
  bad_entry("wrap", 100, ~0ull - 10, 100);                  // wraps
  bad_entry("outside", 100, r2->base() + r2->size(), 100);  // not in the regions
  bad_entry(std::string(5000, 'k'), 100, r2->base(), 100);  // key too long
  bad_entry("fine", 100, r2->base(), 100);                  // from an older master: taken
  ASSERT_TRUE(stub_->Mount(Ctx().get(), junk, &mr).ok());
  EXPECT_EQ(mr.status().code(), 0u) << mr.status().message();
  EXPECT_EQ(mr.recovered(), 1u);
  EXPECT_TRUE(store_->Exists("fine").ok());
  for (const char* k : {"short", "wrap", "outside"}) {
    EXPECT_EQ(store_->Exists(k).code(), StatusCode::kNotFound) << k;
  }
  // Off again, with what it brought: no put of the other tests lands on it.
  pb::NodeRequest off;
  off.set_node("y:1");
  ASSERT_TRUE(stub_->Unmount(Ctx().get(), off, &nr0).ok());
  EXPECT_EQ(nr0.status().code(), 0u);
  EXPECT_EQ(store_->Exists("fine").code(), StatusCode::kNotFound);
  pb::NodeRequest hb;
  hb.set_node("nobody:1");
  pb::NodeResponse nr;
  ASSERT_TRUE(stub_->Heartbeat(Ctx().get(), hb, &nr).ok());
  EXPECT_EQ(nr.status().code(), static_cast<uint32_t>(StatusCode::kNotFound));
  // Still serving.
  EXPECT_TRUE(store_->Put("still-serving", Pattern(10, 1)).ok());
}

// Whether the peer closes `fd` before `deadline`; what it sends meanwhile
// (the server's HTTP/2 settings) is read and dropped.
bool ClosedBefore(int fd, Deadline deadline) {
  char buf[256];
  while (!deadline.Expired()) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    if (recv(fd, buf, sizeof(buf), 0) <= 0) return true;  // EOF or reset
  }
  return false;
}

// Sockets that connect to the master and never speak are closed at its
// handshake timeout (5 s; gRPC's own default is 120 s), and calls are served
// meanwhile (issue 18, point 1).
TEST_F(BadInput, SilentConnectionsToTheMasterAreClosed) {
  const std::string& addr = cluster_->master.address;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1))));
  ASSERT_EQ(inet_pton(AF_INET, addr.substr(0, addr.rfind(':')).c_str(), &a.sin_addr), 1) << addr;
  std::vector<int> silent;
  for (int i = 0; i < 4; ++i) {
    silent.push_back(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(connect(silent.back(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  EXPECT_TRUE(store_->Put("beside-silent", Pattern(10, 2)).ok());
  const Deadline deadline = Deadline::After(std::chrono::seconds(30));
  for (size_t i = 0; i < silent.size(); ++i) {
    EXPECT_TRUE(ClosedBefore(silent[i], deadline)) << "silent connection " << i << " still open";
    close(silent[i]);
  }
  EXPECT_TRUE(store_->Exists("beside-silent").ok());
}

}  // namespace
}  // namespace ferry::test

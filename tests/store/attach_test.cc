// Applications attached to a `ferry node --socket` process: the same Store
// API, bytes moved by the node, batches, multi-buffer objects and a node restart.
#include "store/attach_util.h"

namespace ferry::test {
namespace {

TEST(Attach, PutGetAndSeeEachOthersObjects) {
  auto c = StartAttachCluster("basic");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto a = Store::Attach(c.value().path, Small());
  auto b = Store::Attach(c.value().path, Small());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Store& sa = *a.value();
  Store& sb = *b.value();
  EXPECT_EQ(sa.segment(), c.value().node.segment);
  EXPECT_EQ(sa.master_address(), c.value().master.address);

  // Staged: plain memory, one copy through the shared staging area.
  auto v = Pattern(3 << 20, 1);
  ASSERT_TRUE(sa.Put("staged", v).ok());
  auto got = sb.Get("staged");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), v);

  // Shared: AllocateBuffer memory, no copy.
  auto src = sb.AllocateBuffer(4 << 20);
  auto dst = sa.AllocateBuffer(4 << 20);
  ASSERT_TRUE(src.ok() && dst.ok());
  FillRandom(src.value()->data(), 4 << 20, 2);
  ASSERT_TRUE(sb.PutFrom("shared", {src.value()->data(), 4 << 20}).ok());
  auto n = sa.GetInto("shared", {dst.value()->data(), 4 << 20});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n.value(), 4u << 20);
  EXPECT_EQ(std::memcmp(src.value()->data(), dst.value()->data(), 4 << 20), 0);

  // Registered plain memory goes through staging, both ways.
  std::vector<uint8_t> heap(1 << 20, 0);
  ASSERT_TRUE(sa.RegisterBuffer(heap.data(), heap.size()).ok());
  ASSERT_TRUE(sa.GetInto("staged", {heap.data(), heap.size()}).status().code() ==
              StatusCode::kOutOfRange);
  ASSERT_TRUE(sa.PutFrom("from-heap", {v.data(), 100}).code() == StatusCode::kInvalidArgument);
  std::memcpy(heap.data(), v.data(), 1000);
  ASSERT_TRUE(sa.PutFrom("from-heap", {heap.data(), 1000}).ok());
  std::vector<uint8_t> back(1000);
  ASSERT_TRUE(sb.RegisterBuffer(back.data(), back.size()).ok());
  ASSERT_EQ(sb.GetInto("from-heap", {back.data(), back.size()}).value(), 1000u);
  EXPECT_EQ(std::memcmp(back.data(), v.data(), 1000), 0);

  EXPECT_TRUE(sb.Exists("shared").ok());
  EXPECT_EQ(sb.Exists("nope").code(), StatusCode::kNotFound);
  EXPECT_EQ(sa.Get("nope").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(sa.Pin("shared", StorePin::kHard).ok());
  auto loc = sa.Locate("shared");
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc.value().size, 4u << 20);
  ASSERT_EQ(loc.value().replicas.size(), 1u);
  EXPECT_EQ(loc.value().replicas[0].extents[0].segment, c.value().node.segment);
  auto stats = sa.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats.value().nodes, 1u);
  EXPECT_EQ(stats.value().objects, 3u);
  EXPECT_EQ(stats.value().capacity, 64u << 20);
  EXPECT_TRUE(sa.Remove("staged").ok());
  EXPECT_EQ(sb.Exists("staged").code(), StatusCode::kNotFound);
  // Bad keys are refused, and nothing else is lost.
  EXPECT_EQ(sa.Put("", v).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sa.Put(std::string(Store::kMaxKeyBytes + 1, 'k'), v).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sa.Put("empty", std::span<const uint8_t>()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(sb.Exists("shared").ok());
}

TEST(Attach, BatchesLargerThanStagingTakeRoundsAndOversizeIsRefused) {
  auto c = StartAttachCluster("rounds");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = Store::Attach(c.value().path, Small(1 << 20));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<std::string> keys = {"r0", "r1", "r2", "r3", "r4"};
  std::vector<std::vector<uint8_t>> vals;
  std::vector<std::span<const uint8_t>> spans;
  for (size_t i = 0; i < keys.size(); ++i) vals.push_back(Pattern(400 << 10, 10 + i));
  for (auto& v : vals) spans.emplace_back(v);
  for (const Status& st : s.value()->BatchPut(keys, spans)) EXPECT_TRUE(st.ok()) << st.ToString();
  auto got = s.value()->BatchGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().ToString();
    EXPECT_EQ(got[i].value(), vals[i]);
  }
  auto big = Pattern((1 << 20) + 1, 3);
  Status st = s.value()->Put("big", big);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("staging"), std::string::npos) << st.ToString();
  // Put from shared memory, too big to get through staging.
  auto mem = s.value()->AllocateBuffer(big.size());
  ASSERT_TRUE(mem.ok());
  std::memcpy(mem.value()->data(), big.data(), big.size());
  ASSERT_TRUE(s.value()->PutFrom("big", {mem.value()->data(), big.size()}).ok());
  auto g = s.value()->Get("big");
  EXPECT_EQ(g.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(g.status().message().find("staging"), std::string::npos);
}

// Multi-buffer puts and gets on `s`: one object from several buffers of
// uneven sizes, read back split another way; small (copied inline) and large
// (on the engine's copy threads) values.
void MultiBufferRoundTrips(Store& s, const std::string& prefix) {
  for (const std::vector<size_t>& split :
       std::vector<std::vector<size_t>>{{10, 20, 30}, {1000, 1 << 20, 3, 5 << 20}}) {
    size_t total = 0;
    for (size_t n : split) total += n;
    auto mem = s.AllocateBuffer(total);
    auto back = s.AllocateBuffer(total + 7);
    ASSERT_TRUE(mem.ok() && back.ok());
    auto* src = static_cast<uint8_t*>(mem.value()->data());
    auto* dst = static_cast<uint8_t*>(back.value()->data());
    FillRandom(src, total, total);
    std::vector<StoreBuffer> in;
    for (size_t off = 0, k = 0; k < split.size(); off += split[k++])
      in.push_back({src + off, split[k]});
    const std::string key = prefix + "/multi/" + std::to_string(total);
    std::vector<std::string> keys = {key};
    std::vector<std::vector<StoreBuffer>> ins = {in};
    ASSERT_TRUE(s.BatchPutFromMulti(keys, ins)[0].ok());
    // Read back into two buffers split elsewhere, the last one with room to spare.
    std::memset(dst, 0, total + 7);
    std::vector<std::vector<StoreBuffer>> outs = {
        {{dst, total / 3}, {dst + total / 3, total - total / 3 + 7}}};
    auto got = s.BatchGetIntoMulti(keys, outs);
    ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
    EXPECT_EQ(got[0].value(), total);
    EXPECT_EQ(std::memcmp(src, dst, total), 0);
    // Parts from plain memory, copied.
    std::vector<uint8_t> heap(src, src + total);
    std::vector<StoreBuffer> plain;
    for (size_t off = 0, k = 0; k < split.size(); off += split[k++])
      plain.push_back({heap.data() + off, split[k]});
    std::vector<std::string> pkeys = {key + "/parts"};
    std::vector<std::vector<StoreBuffer>> pins = {plain};
    ASSERT_TRUE(s.BatchPutParts(pkeys, pins)[0].ok());
    auto whole = s.Get(pkeys[0]);
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(whole.value(), heap);
    // Too little room: refused, and the buffers untouched.
    std::memset(dst, 0xee, total + 7);
    std::vector<std::vector<StoreBuffer>> small = {{{dst, 5}, {dst + 5, total - 6}}};
    EXPECT_EQ(s.BatchGetIntoMulti(keys, small)[0].status().code(), StatusCode::kOutOfRange);
    EXPECT_TRUE(std::all_of(dst, dst + total + 7, [](uint8_t b) { return b == 0xee; }));
    // A part outside registered memory.
    std::vector<std::vector<StoreBuffer>> stray = {{{src, 10}, {heap.data(), 10}}};
    std::vector<std::string> skeys = {key + "/stray"};
    EXPECT_EQ(s.BatchPutFromMulti(skeys, stray)[0].code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.Exists(skeys[0]).code(), StatusCode::kNotFound);
  }
}

TEST(Attach, MultiBufferObjectsEmbeddedRemoteAndAttached) {
  auto c = StartAttachCluster("multi");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  StoreOptions own;  // a node and a master in this process
  own.local_memory = 32 << 20;
  auto embedded = Store::Create(own);
  ASSERT_TRUE(embedded.ok()) << embedded.status().ToString();
  MultiBufferRoundTrips(*embedded.value(), "embedded");
  auto remote = Client(c.value().master.address);
  ASSERT_TRUE(remote.ok());
  MultiBufferRoundTrips(*remote.value(), "remote");
  auto attached = Store::Attach(c.value().path, Small());
  ASSERT_TRUE(attached.ok());
  MultiBufferRoundTrips(*attached.value(), "attached");
  // Attached, a part in plain registered memory goes through staging.
  Store& a = *attached.value();
  auto mem = a.AllocateBuffer(4096);
  ASSERT_TRUE(mem.ok());
  std::vector<uint8_t> heap(3000);
  ASSERT_TRUE(a.RegisterBuffer(heap.data(), heap.size()).ok());
  FillRandom(mem.value()->data(), 4096, 1);
  FillRandom(heap.data(), heap.size(), 2);
  std::vector<std::string> keys = {"mixed"};
  std::vector<std::vector<StoreBuffer>> in = {{{mem.value()->data(), 4096}, {heap.data(), 3000}}};
  ASSERT_TRUE(a.BatchPutFromMulti(keys, in)[0].ok());
  auto got = a.Get("mixed");
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got.value().size(), 7096u);
  EXPECT_EQ(std::memcmp(got.value().data(), mem.value()->data(), 4096), 0);
  EXPECT_EQ(std::memcmp(got.value().data() + 4096, heap.data(), 3000), 0);
  std::vector<uint8_t> back(3000, 0);
  ASSERT_TRUE(a.RegisterBuffer(back.data(), back.size()).ok());
  std::memset(mem.value()->data(), 0, 4096);
  std::vector<std::vector<StoreBuffer>> out = {{{mem.value()->data(), 4096}, {back.data(), 3000}}};
  ASSERT_TRUE(a.BatchGetIntoMulti(keys, out)[0].ok());
  EXPECT_EQ(std::memcmp(back.data(), heap.data(), 3000), 0);
}

TEST(Attach, ANodeRestartFailsOneCallThenTheClientAttachesAgain) {
  auto c = StartAttachCluster("restart");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = Store::Attach(c.value().path, Small());
  ASSERT_TRUE(s.ok());
  auto mem = s.value()->AllocateBuffer(1 << 20);
  ASSERT_TRUE(mem.ok());
  FillRandom(mem.value()->data(), 1 << 20, 5);
  ASSERT_TRUE(s.value()->PutFrom("before", {mem.value()->data(), 1 << 20}).ok());

  ASSERT_TRUE(c.value().node.proc->Signal(SIGKILL).ok());
  ASSERT_TRUE(c.value().node.proc->Wait(Millis(10000)).ok());
  auto again = StartSocketNode(c.value().master.address, c.value().path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();

  Status first = s.value()->Put("after", Pattern(100, 6));
  EXPECT_EQ(first.code(), StatusCode::kConnectionLost) << first.ToString();
  // The next call attaches again and shares the buffer anew.
  FillRandom(mem.value()->data(), 1 << 20, 7);
  Status put = s.value()->PutFrom("after", {mem.value()->data(), 1 << 20});
  ASSERT_TRUE(put.ok()) << put.ToString();
  EXPECT_EQ(s.value()->segment(), again.value().segment);
  std::memset(mem.value()->data(), 0, 1 << 20);
  ASSERT_TRUE(s.value()->GetInto("after", {mem.value()->data(), 1 << 20}).ok());
  auto want = Pattern(1 << 20, 7);
  EXPECT_EQ(std::memcmp(mem.value()->data(), want.data(), want.size()), 0);
}

// A receive that looks before it sleeps sees a frame that comes during the
// look and one that comes after it, and still keeps its deadline and notices
// a peer that leaves.
TEST(Attach, AReceiveThatSpinsSeesFramesEarlyOrLateAndKeepsItsDeadline) {
  using std::chrono::microseconds;
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
  const std::vector<uint8_t> payload = {1, 2, 3};
  auto send_after = [&](Millis delay, uint64_t id) {
    return std::thread([&, delay, id] {
      std::this_thread::sleep_for(delay);
      ASSERT_TRUE(attach::Send(sv[1], attach::Type::kExists, id, 1000, StatusCode::kOk, payload,
                               Deadline::After(Millis(2000)))
                      .ok());
    });
  };
  for (auto [delay, spin, id] : {std::tuple{Millis(2), microseconds(50000), 1},
                                 std::tuple{Millis(20), microseconds(1000), 2}}) {
    std::thread t = send_after(delay, static_cast<uint64_t>(id));
    auto f = attach::Receive(sv[0], Deadline::After(Millis(5000)), Millis(5000), spin);
    t.join();
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ(f.value().id, static_cast<uint64_t>(id));
    EXPECT_EQ(f.value().payload, payload);
  }
  const auto t0 = Clock::now();
  auto none =
      attach::Receive(sv[0], Deadline::After(Millis(30)), Millis(5000), microseconds(10000));
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout) << none.status().ToString();
  EXPECT_GE(Clock::now() - t0, Millis(30));
  const auto t1 = Clock::now();
  none = attach::Receive(sv[0], Deadline::After(Millis(5)), Millis(5000), microseconds(2000000));
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout) << none.status().ToString();
  EXPECT_LT(Clock::now() - t1, Millis(1000)) << "the look outlasted the deadline";
  close(sv[1]);
  auto gone =
      attach::Receive(sv[0], Deadline::After(Millis(5000)), Millis(5000), microseconds(50000));
  EXPECT_EQ(gone.status().code(), StatusCode::kConnectionLost) << gone.status().ToString();
  close(sv[0]);
}

}  // namespace
}  // namespace ferry::test

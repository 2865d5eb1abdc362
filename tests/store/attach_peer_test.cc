// The attach socket against bad and hostile peers: silent connections, other
// uids, malformed frames, bad file descriptors, the socket file, the secret.
#include "store/attach_util.h"

namespace ferry::test {
namespace {

// Connections that never say Hello lock nobody out (issue 18, point 1):
// past the cap (and the few kept to be told why) they are closed at once,
// without waiting for a Hello; the rest at the handshake timeout, and then a
// client gets in.
TEST(Attach, SilentConnectionsPastTheCapAreClosedAtOnceAndTheRestInTime) {
  auto master = cli::SpawnMaster(FerryBin(), {"--tick-ms", "20"});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  store::AttachOptions o;
  o.path = SocketPath("flood");
  o.max_clients = 2;
  o.handshake_timeout = Millis(120000);  // long: what closes these is not the timeout
  auto here = ServeHere(master.value().address, o);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  std::vector<int> held;  // two served, eight to be told why
  for (int i = 0; i < 2 + 8; ++i) {
    held.push_back(RawConnect(o.path));
    ASSERT_GE(held.back(), 0);
  }
  for (int i = 0; i < 4; ++i) {
    int fd = RawConnect(o.path);
    ASSERT_GE(fd, 0);
    EXPECT_TRUE(ClosedByPeer(fd)) << "connection " << i << " past the cap is still open";
    close(fd);
  }
  for (int fd : held) close(fd);
  EXPECT_TRUE(Eventually([&] { return AttachAndAsk(o.path).ok(); }));

  // With a short handshake timeout, silent connections in every slot are
  // closed once it passes, and a client that says Hello gets in.
  o.path = SocketPath("silent");
  o.handshake_timeout = Millis(300);
  auto quick = ServeHere(master.value().address, o);
  ASSERT_TRUE(quick.ok()) << quick.status().ToString();
  held.clear();
  for (int i = 0; i < 2 + 8; ++i) {
    held.push_back(RawConnect(o.path));
    ASSERT_GE(held.back(), 0);
  }
  Status st = Status::Timeout("never tried");
  EXPECT_TRUE(Eventually([&] { return (st = AttachAndAsk(o.path)).ok(); })) << st.ToString();
  for (int fd : held) {
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
  }
}

// A uid the node refuses takes no client's slot, and each allowed uid other
// than the node's own holds at most max_clients_per_uid (issue 18, point 1).
TEST(Attach, RefusedUidsTakeNoSlotAndEachOtherUidIsCapped) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to connect as other uids";
  constexpr uint32_t kAllowed = 65534, kStranger = 65533;
  auto master = cli::SpawnMaster(FerryBin(), {"--tick-ms", "20"});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  store::AttachOptions o;
  o.path = SocketPath("uids");
  o.allow_uids = {kAllowed};
  o.max_clients = 4;
  o.max_clients_per_uid = 2;
  o.handshake_timeout = Millis(120000);
  auto here = ServeHere(master.value().address, o);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  std::vector<int> fds;
  for (int i = 0; i < 6; ++i) {  // silent, from a uid that may not attach
    fds.push_back(RawConnectAs(kStranger, o.path));
    ASSERT_GE(fds.back(), 0);
  }
  for (int i = 0; i < 2; ++i) {
    fds.push_back(RawConnectAs(kAllowed, o.path));
    ASSERT_GE(fds.back(), 0);
    EXPECT_TRUE(SaysHello(fds.back())) << "allowed client " << i;
  }
  fds.push_back(RawConnectAs(kAllowed, o.path));
  ASSERT_GE(fds.back(), 0);
  EXPECT_FALSE(SaysHello(fds.back())) << "a third client of one uid was admitted";
  // The node's own uid is not capped per uid, and still finds room.
  Status st = AttachAndAsk(o.path);
  EXPECT_TRUE(st.ok()) << st.ToString();
  for (int fd : fds) close(fd);
}

TEST(Attach, NothingListeningIsUnavailable) {
  auto s = Store::Attach(SocketPath("nobody-here"), Small());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable) << s.status().ToString();
}

TEST(Attach, MalformedFramesCloseOnlyThatClient) {
  auto c = StartAttachCluster("malformed");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto good = Store::Attach(c.value().path, Small());
  ASSERT_TRUE(good.ok());
  ASSERT_TRUE(good.value()->Put("kept", Pattern(1000, 4)).ok());

  // Garbage instead of a Hello.
  int g = RawConnect(c.value().path);
  ASSERT_GE(g, 0);
  const char junk[64] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(write(g, junk, sizeof(junk)), static_cast<ssize_t>(sizeof(junk)));
  EXPECT_TRUE(ClosedByPeer(g));
  close(g);

  // A request with a status code set.
  int s = RawAttached(c.value().path);
  ASSERT_GE(s, 0);
  auto r = RawCall(s, attach::Type::kStats, {}, -1, StatusCode::kNotFound);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().code, StatusCode::kProtocolError);
  EXPECT_TRUE(ClosedByPeer(s));
  close(s);

  // A Put whose item count runs past the payload.
  int p = RawAttached(c.value().path);
  ASSERT_GE(p, 0);
  std::vector<uint8_t> put;
  ByteWriter w(&put);
  w.U32(1);
  w.U8(0);
  w.U64(0);
  w.Str("");
  w.I32(-1);  // no GPU memory
  w.Str("");
  w.U32(1000);
  w.Str("k");
  r = RawCall(p, attach::Type::kPut, put);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().code, StatusCode::kProtocolError);
  EXPECT_TRUE(ClosedByPeer(p));
  close(p);

  // The attached client kept working throughout.
  auto got = good.value()->Get("kept");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), Pattern(1000, 4));
}

TEST(Attach, FileDescriptorsThatAreNotSealedMemfdsOfTheirSizeAreRefused) {
  auto c = StartAttachCluster("fds");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  int s = RawAttached(c.value().path);
  ASSERT_GE(s, 0);
  auto reg = [&](int fd, uint64_t size) {
    std::vector<uint8_t> p;
    ByteWriter(&p).U64(size);
    auto r = RawCall(s, attach::Type::kRegister, p, fd);
    return r.ok() ? attach::ReplyStatus(r.value()) : r.status();
  };
  // A pipe, and a regular file, are not memfds.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  Status st = reg(pipefd[0], 4096);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("memfd"), std::string::npos);
  close(pipefd[0]);
  close(pipefd[1]);
  char tmpl[] = "/tmp/ferry-attach-file-XXXXXX";
  int file = mkstemp(tmpl);
  ASSERT_GE(file, 0);
  ASSERT_EQ(ftruncate(file, 8192), 0);
  unlink(tmpl);
  EXPECT_EQ(reg(file, 4096).code(), StatusCode::kInvalidArgument);
  close(file);
  // A memfd that could shrink under the node's mapping.
  int loose = memfd_create("loose", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(loose, 8192), 0);
  st = reg(loose, 8192);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("F_SEAL_SHRINK"), std::string::npos) << st.ToString();
  close(loose);
  // A sealed memfd smaller than it claims.
  int small = memfd_create("small", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(small, 4096), 0);
  ASSERT_EQ(fcntl(small, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  st = reg(small, 1 << 20);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("claimed"), std::string::npos) << st.ToString();
  // The same memfd at its true size is accepted: the refusals were about the fds.
  EXPECT_TRUE(reg(small, 4096).ok());
  close(small);
  // A Register with no fd at all.
  EXPECT_EQ(reg(-1, 4096).code(), StatusCode::kInvalidArgument);
  close(s);
}

TEST(Attach, TheSocketIsOwnerOnlyAndAStaleOneIsReplaced) {
  auto c = StartAttachCluster("mode");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  struct stat sb {};
  ASSERT_EQ(stat(c.value().path.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISSOCK(sb.st_mode));
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
  // A node killed leaves its socket file; the next one binds over it.
  ASSERT_TRUE(c.value().node.proc->Signal(SIGKILL).ok());
  ASSERT_TRUE(c.value().node.proc->Wait(Millis(10000)).ok());
  auto again = StartSocketNode(c.value().master.address, c.value().path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(Store::Attach(c.value().path, Small()).ok());
  // A path that is not a socket is never replaced.
  const std::string file = SocketPath("regular-file");
  int fd = open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  auto refused = StartSocketNode(c.value().master.address, file);
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(access(file.c_str(), F_OK), 0);
  unlink(file.c_str());
}

// The cluster secret on the socket (issue 18, point 2): SO_PEERCRED admits a
// uid, and then a client must still prove the secret before anything is
// served; the node proves it back first.
TEST(Attach, WithASecretOnlyClientsThatProveItAreServed) {
  constexpr char kSecret[] = "this cluster's secret: 32 bytes!";
  KeyFile key("attach", kSecret), other("attach-other", "another cluster's secret, as long");
  ASSERT_TRUE(key.ok() && other.ok());
  auto master = cli::SpawnMaster(FerryBin(), {"--tick-ms", "20", "--auth-key-file", key.path()});
  ASSERT_TRUE(master.ok()) << master.status().ToString();
  // A `ferry node` process with the key holds the memory, and serves a socket too.
  const std::string path = SocketPath("secret-node");
  auto node =
      cli::SpawnNode(FerryBin(), master.value().address,
                     {"--segment-size", "16MiB", "--socket", path, "--auth-key-file", key.path()});
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  // One in this process, to read its counter.
  store::AttachOptions o;
  o.path = SocketPath("secret");
  auto here = ServeHere(master.value().address, o, key.path());
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  const store::AttachServer& server = *here.value().server;
  auto with = [](const std::string& file) {
    StoreOptions so = Small();
    so.auth_key_file = file;
    return so;
  };

  auto good = Store::Attach(o.path, with(key.path()));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ASSERT_TRUE(good.value()->Put("kept", Pattern(1000, 5)).ok());
  auto got = good.value()->Get("kept");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got.value(), Pattern(1000, 5));
  // Without the key, or with another, the client gives up on its own (the
  // node asked for a proof, or gave a wrong one).
  for (const std::string& file : {std::string(), other.path()}) {
    auto s = Store::Attach(o.path, with(file));
    EXPECT_EQ(s.status().code(), StatusCode::kUnauthenticated) << s.status().ToString();
  }
  EXPECT_EQ(server.auth_failures(), 0u);

  // Raw clients that skip the proof get nothing served: a Stats, and a
  // Register whose memfd the node would map.
  auto raw_hello = [&](const std::string& nonce) {
    int fd = RawConnect(o.path);
    std::vector<uint8_t> hello;
    ByteWriter hw(&hello);
    hw.U32(1);
    if (!nonce.empty()) hw.Str(nonce);
    auto r = RawCall(fd, attach::Type::kHello, hello);
    EXPECT_TRUE(r.ok() && r.value().code == StatusCode::kOk);
    return std::make_pair(fd, r.ok() ? r.value().payload : std::vector<uint8_t>());
  };
  uint64_t refused = 0;
  {
    auto [fd, reply] = raw_hello("");
    auto r = RawCall(fd, attach::Type::kStats, {});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().code, StatusCode::kUnauthenticated);
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(server.auth_failures(), ++refused);
  }
  {
    auto mem = StoreMemory::Create(4096);
    ASSERT_TRUE(mem.ok());
    auto [fd, reply] = raw_hello("");
    std::vector<uint8_t> reg;
    ByteWriter(&reg).U64(4096);
    auto r = RawCall(fd, attach::Type::kRegister, reg, mem.value()->fd());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().code, StatusCode::kUnauthenticated);
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(server.auth_failures(), ++refused);
  }
  // A genuine exchange by a raw client holding the key, recorded, then sent
  // again on a new connection: the node's fresh challenge refuses it.
  auto k = auth::LoadConfigured(key.path());
  ASSERT_TRUE(k.ok());
  const std::string nonce(32, 'n');
  std::vector<uint8_t> recorded;
  auto challenge_of = [](const std::vector<uint8_t>& reply) {
    ByteReader r(reply.data(), reply.size());
    r.Str(attach::kMaxMessage), r.Str(attach::kMaxMessage), r.U64(), r.U32();
    return r.Str(auth::kNonceBytes);
  };
  {
    auto [fd, reply] = raw_hello(nonce);
    const std::string challenge = challenge_of(reply);
    ASSERT_EQ(challenge.size(), auth::kNonceBytes);
    const auth::Mac proof = attach::ClientProof(*k.value(), nonce, challenge);
    ByteWriter(&recorded).Str(
        std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()));
    auto r = RawCall(fd, attach::Type::kAuth, recorded);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().code, StatusCode::kOk);
    r = RawCall(fd, attach::Type::kStats, {});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().code, StatusCode::kOk) << "an authenticated client was refused";
    close(fd);
  }
  EXPECT_EQ(server.auth_failures(), refused);
  for (int wrong = 0; wrong < 2; ++wrong) {  // the recorded proof, then junk
    auto [fd, reply] = raw_hello(nonce);
    std::vector<uint8_t> junk;
    ByteWriter(&junk).Str(std::string(auth::kMacBytes, 'j'));
    auto r = RawCall(fd, attach::Type::kAuth, wrong == 0 ? recorded : junk);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().code, StatusCode::kUnauthenticated) << wrong;
    EXPECT_TRUE(ClosedByPeer(fd));
    close(fd);
    EXPECT_EQ(server.auth_failures(), ++refused);
  }
  EXPECT_EQ(good.value()->Get("kept").value(), Pattern(1000, 5)) << "the good client was cut off";

  // The node process the same way; and a client with the key refuses a node
  // that holds none.
  auto attached = Store::Attach(path, with(key.path()));
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  EXPECT_TRUE(attached.value()->Exists("kept").ok());
  EXPECT_EQ(Store::Attach(path, with("")).status().code(), StatusCode::kUnauthenticated);
  auto open_master = cli::SpawnMaster(FerryBin(), {"--tick-ms", "20"});
  ASSERT_TRUE(open_master.ok());
  store::AttachOptions open;
  open.path = SocketPath("no-secret");
  auto open_here = ServeHere(open_master.value().address, open);
  ASSERT_TRUE(open_here.ok()) << open_here.status().ToString();
  auto s = Store::Attach(open.path, with(key.path()));
  EXPECT_EQ(s.status().code(), StatusCode::kUnauthenticated) << s.status().ToString();
  KeyFile loose("attach-loose", kSecret, 0640);
  ASSERT_TRUE(loose.ok());
  EXPECT_EQ(Store::Attach(open.path, with(loose.path())).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::test

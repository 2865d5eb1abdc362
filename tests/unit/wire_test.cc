// The tcp frame header: packed little-endian, every field validated.
#include <gtest/gtest.h>

#include <asio.hpp>  // after standard headers: see asio_first.cc
#include <string>

#ifdef ASIO_HAS_STD_ALIGNED_ALLOC
#error "asio's aligned allocation must be disabled for every file; see CMakeLists.txt"
#endif

#include <vector>

#include "common/bytes.h"
#include "transfer/frame_wire.h"
#include "transfer/socket_write.h"
#include "transfer/tcp/socket_io.h"

namespace ferry {
namespace {

TEST(Wire, HeaderIsPackedLittleEndianAndValidated) {
  uint8_t h[wire::kHeaderSize];
  memset(h, 0xee, sizeof(h));
  wire::EncodeHeader({wire::Opcode::kWrite, StatusCode::kOutOfRange, 0x1122, 0xdeadbeef, 4096}, h);
  EXPECT_EQ(h[0], 0x46);  // 'F'
  EXPECT_EQ(h[4], wire::kVersion);
  EXPECT_EQ(h[7], 0);  // the flags byte is written, never left uninitialised
  EXPECT_EQ(h[8], 0x22);
  auto d = wire::DecodeHeader(h);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value().opcode, wire::Opcode::kWrite);
  EXPECT_EQ(d.value().status, StatusCode::kOutOfRange);
  EXPECT_EQ(d.value().id, 0x1122u);
  EXPECT_EQ(d.value().addr, 0xdeadbeefu);
  EXPECT_EQ(d.value().length, 4096u);
  for (int byte : {0, 4, 5, 6, 7}) {
    uint8_t bad[wire::kHeaderSize];
    memcpy(bad, h, sizeof(bad));
    bad[byte] = 0xff;
    EXPECT_EQ(wire::DecodeHeader(bad).status().code(), StatusCode::kProtocolError) << byte;
  }
}

// The flags byte: kFlagCrc32c on the frames that carry or ask for a
// payload, and nowhere else; the trailer is little-endian.
TEST(Wire, TheChecksumFlagGoesOnDataFramesOnly) {
  using wire::Opcode;
  uint8_t h[wire::kHeaderSize];
  for (Opcode op : {Opcode::kWrite, Opcode::kRead, Opcode::kReadData}) {
    wire::EncodeHeader({op, StatusCode::kOk, 1, 2, 3, wire::kFlagCrc32c}, h);
    EXPECT_EQ(h[7], wire::kFlagCrc32c);
    auto d = wire::DecodeHeader(h);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d.value().flags, wire::kFlagCrc32c);
  }
  for (Opcode op : {Opcode::kHello, Opcode::kHelloAck, Opcode::kGetDescriptor, Opcode::kDescriptor,
                    Opcode::kWriteAck}) {
    wire::EncodeHeader({op, StatusCode::kOk, 1, 2, 0, wire::kFlagCrc32c}, h);
    EXPECT_EQ(wire::DecodeHeader(h).status().code(), StatusCode::kProtocolError)
        << static_cast<int>(op);
  }
  // An error reply has no payload, so nothing to sum.
  wire::EncodeHeader({Opcode::kReadData, StatusCode::kOutOfRange, 1, 2, 0, wire::kFlagCrc32c}, h);
  EXPECT_EQ(wire::DecodeHeader(h).status().code(), StatusCode::kProtocolError);
  wire::EncodeHeader({Opcode::kWrite, StatusCode::kOk, 1, 2, 3, 2}, h);  // unknown flag
  EXPECT_EQ(wire::DecodeHeader(h).status().code(), StatusCode::kProtocolError);
  uint8_t t[wire::kCrcBytes];
  wire::EncodeCrc(0xe3069283u, t);
  EXPECT_EQ(t[0], 0x83);
  EXPECT_EQ(t[3], 0xe3);
  EXPECT_EQ(wire::DecodeCrc(t), 0xe3069283u);
}

// A stream that records what each send is offered, and takes it all.
struct OfferedSends {
  using executor_type = asio::io_context::executor_type;
  asio::io_context& io;
  std::vector<size_t> offered;
  executor_type get_executor() { return io.get_executor(); }
  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    const size_t n = asio::buffer_size(buffers);
    offered.push_back(n);
    asio::post(io, [h = std::forward<Handler>(handler), n]() mutable { h(asio::error_code(), n); });
  }
};

// A gathered write of a megabyte is offered to one send whole; asio's own
// async_write offers 64 KiB at a time (16 sendmsg calls for it on a socket).
TEST(WholeSends, OneSendIsOfferedTheWholeGatheredWrite) {
  std::vector<char> header(32), payload(1 << 20);
  std::vector<asio::const_buffer> bufs = {asio::buffer(header), asio::buffer(payload)};
  const size_t total = header.size() + payload.size();
  asio::io_context io;
  OfferedSends whole{io, {}}, capped{io, {}};
  size_t wrote = 0;
  AsyncWriteAll(whole, bufs, [&](asio::error_code ec, size_t n) {
    EXPECT_FALSE(ec);
    wrote = n;
  });
  asio::async_write(capped, bufs, [](asio::error_code, size_t) {});
  io.run();
  EXPECT_EQ(wrote, total);
  EXPECT_EQ(whole.offered, std::vector<size_t>{total});
  EXPECT_EQ(capped.offered.size(), total / 65536 + 1) << "asio's ceiling changed";
}

// With a tail, the receive that ends a payload also takes what follows it,
// up to the tail's room and no further: the next frame's header comes in
// the same call, and the bytes after it stay on the socket.
TEST(PayloadReceive, TheTailTakesWhatFollowsUpToItsRoom) {
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
  asio::ip::tcp::socket sender(io), receiver(io);
  sender.connect(acceptor.local_endpoint());
  acceptor.accept(receiver);
  sender.set_option(asio::ip::tcp::no_delay(true));  // else Nagle may hold what follows
  std::vector<char> sent(64 << 10);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 13 + 5);
  const std::string next(32, 'h'), after = "rest of the stream";
  std::vector<char> stream(sent);
  stream.insert(stream.end(), next.begin(), next.end());
  stream.insert(stream.end(), after.begin(), after.end());
  // One send: on loopback every byte is queued at the receiver when it returns.
  ASSERT_EQ(::send(sender.native_handle(), stream.data(), stream.size(), 0),
            static_cast<ssize_t>(stream.size()));
  std::vector<char> payload(sent.size());
  uint8_t header[32];
  ReceiveTail tail{header, sizeof(header), 0};
  RcvLowat lowat;
  bool done = false;
  AsyncReadPayload(
      receiver, payload.data(), payload.size(), &lowat,
      [&](asio::error_code ec) {
        EXPECT_FALSE(ec);
        done = true;
      },
      &tail);
  io.run();
  ASSERT_TRUE(done);
  EXPECT_EQ(payload, sent);
  ASSERT_EQ(tail.got, sizeof(header)) << "the next header did not come with the payload";
  EXPECT_EQ(std::string(reinterpret_cast<char*>(header), sizeof(header)), next);
  std::string rest(after.size(), '\0');
  asio::read(receiver, asio::buffer(rest));
  EXPECT_EQ(rest, after);
}

// While a payload is awaited, the socket's SO_RCVLOWAT is raised to the
// ceiling, never past what remains, and is 1 again once the payload is in;
// with no ceiling it is never raised.
TEST(PayloadReceive, TheLowWaterMarkRisesToItsCeilingOnlyWhileAwaiting) {
  for (const int ceiling : {0, 16 << 10, 256 << 10}) {
    SCOPED_TRACE(ceiling);
    asio::io_context io;
    asio::ip::tcp::acceptor acceptor(io, {asio::ip::address_v4::loopback(), 0});
    asio::ip::tcp::socket sender(io), receiver(io);
    sender.connect(acceptor.local_endpoint());
    acceptor.accept(receiver);
    std::vector<char> sent(64 << 10);
    for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 7 + 1);
    const size_t first = 8 << 10;
    ASSERT_EQ(::send(sender.native_handle(), sent.data(), first, 0), static_cast<ssize_t>(first));
    std::vector<char> payload(sent.size());
    RcvLowat lowat{ceiling, 1};
    bool done = false;
    AsyncReadPayload(receiver, payload.data(), payload.size(), &lowat, [&](asio::error_code ec) {
      EXPECT_FALSE(ec);
      done = true;
    });
    io.poll();  // takes what has come, then waits for the rest
    ASSERT_FALSE(done);
    auto mark = [&] {
      int v = 0;
      socklen_t len = sizeof(v);
      EXPECT_EQ(::getsockopt(receiver.native_handle(), SOL_SOCKET, SO_RCVLOWAT, &v, &len), 0);
      return v;
    };
    const int awaiting = ceiling == 0 ? 1 : std::min<int>(ceiling, sent.size() - first);
    EXPECT_EQ(mark(), awaiting);
    EXPECT_EQ(lowat.current, awaiting);
    asio::write(sender, asio::buffer(sent.data() + first, sent.size() - first));
    io.restart();
    io.run();
    ASSERT_TRUE(done);
    EXPECT_EQ(payload, sent);
    EXPECT_EQ(mark(), 1);
    EXPECT_EQ(lowat.current, 1);
  }
}

// The ceiling: 256 KiB where the io threads sleep at once, none where they
// poll; FERRY_TCP_RCVLOWAT_KIB where set, for both.
TEST(PayloadReceive, TheLowWaterMarkCeilingFollowsPolling) {
  unsetenv("FERRY_TCP_RCVLOWAT_KIB");
  EXPECT_EQ(RcvLowatCeiling(0), 256 << 10);
  EXPECT_EQ(RcvLowatCeiling(50), 0);
  setenv("FERRY_TCP_RCVLOWAT_KIB", "64", 1);
  EXPECT_EQ(RcvLowatCeiling(0), 64 << 10);
  EXPECT_EQ(RcvLowatCeiling(50), 64 << 10);
  setenv("FERRY_TCP_RCVLOWAT_KIB", "0", 1);
  EXPECT_EQ(RcvLowatCeiling(0), 0);
  unsetenv("FERRY_TCP_RCVLOWAT_KIB");
}

}  // namespace
}  // namespace ferry

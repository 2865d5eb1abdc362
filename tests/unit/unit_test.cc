// Unit tests of the pieces under the engine: status, byte codec, frame header,
// descriptor codec, memory registry, segment names, batch bookkeeping and the
// periodic-job thread.
#include <gtest/gtest.h>
#include <pthread.h>

#include <asio.hpp>  // after standard headers: see asio_first.cc
#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#ifdef ASIO_HAS_STD_ALIGNED_ALLOC
#error "asio's aligned allocation must be disabled for every file; see CMakeLists.txt"
#endif

#include "common/bytes.h"
#include "common/thread_pool.h"
#include "common/ticker.h"
#include "ferry/status.h"
#include "transfer/batch.h"
#include "transfer/descriptor.h"
#include "transfer/memory_registry.h"
#include "transfer/metadata.h"
#include "transfer/tcp/wire.h"

namespace ferry {
namespace {

Status Fails() { return Status(StatusCode::kNotFound, "nope"); }
Status Propagates() {
  FERRY_RETURN_IF_ERROR(Fails());
  return Status::Ok();
}
Result<int> Seven() { return 7; }
Result<int> Doubled() {
  FERRY_ASSIGN_OR_RETURN(int v, Seven());
  return v * 2;
}

TEST(Status, CodesMessagesAndMacros) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  Status s = Propagates();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NotFound: nope");
  EXPECT_EQ(Doubled().value(), 14);
  Status e = Status::FromErrno(ENOENT, "open x");
  EXPECT_EQ(e.code(), StatusCode::kIoError);
  EXPECT_NE(e.message().find("open x"), std::string::npos);
  Result<int> r(Status(StatusCode::kTimeout, "late"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
}

TEST(Bytes, LittleEndianRoundTripAndShortReads) {
  std::vector<uint8_t> buf;
  ByteWriter w(&buf);
  w.U8(1);
  w.U16(0x0203);
  w.U32(0x04050607);
  w.U64(0x08090a0b0c0d0e0full);
  w.Str("hi");
  ASSERT_EQ(buf.size(), 1u + 2 + 4 + 8 + 4 + 2);
  EXPECT_EQ(buf[1], 0x03);  // little-endian
  ByteReader r(buf.data(), buf.size());
  EXPECT_EQ(r.U8(), 1);
  EXPECT_EQ(r.U16(), 0x0203);
  EXPECT_EQ(r.U32(), 0x04050607u);
  EXPECT_EQ(r.U64(), 0x08090a0b0c0d0e0full);
  EXPECT_EQ(r.Str(10), "hi");
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.U8(), 0);
  EXPECT_FALSE(r.ok());
  ByteReader longstr(buf.data() + 15, 6);
  EXPECT_EQ(longstr.Str(1), "");  // longer than allowed
  EXPECT_FALSE(longstr.ok());
}

TEST(Wire, HeaderIsPackedLittleEndianAndValidated) {
  uint8_t h[wire::kHeaderSize];
  memset(h, 0xee, sizeof(h));
  wire::EncodeHeader({wire::Opcode::kWrite, StatusCode::kOutOfRange, 0x1122, 0xdeadbeef, 4096}, h);
  EXPECT_EQ(h[0], 0x46);  // 'F'
  EXPECT_EQ(h[4], wire::kVersion);
  EXPECT_EQ(h[7], 0);  // reserved byte is written, never left uninitialised
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

Region R(uint64_t addr, uint64_t length) {
  Region r;
  r.addr = addr;
  r.length = length;
  return r;
}

SegmentDescriptor Sample() {
  SegmentDescriptor d;
  d.epoch = 99;
  d.host_id = "boot/4026531836";
  d.pid = 1234;
  d.generation = 0x0102030405060708;
  d.control_memfd = 9;
  d.transports = {"tcp", "shm"};
  d.transport_blobs = {"", "segment-wide"};
  RegionDesc a, b;
  a.addr = 0x1000;
  a.length = 0x1000;
  a.allocated = true;
  a.blobs = {"", std::string("\x07\0\0\0", 4)};
  b.addr = 0x3000;
  b.length = 0x100;
  b.kind = 2;  // device memory
  b.device = 1;
  b.serial = 0x1122334455667788;
  b.blobs = {std::string(kMaxRegionBlob, 'h'), ""};
  d.regions = {a, b};
  return d;
}

TEST(Descriptor, RoundTripAndLookup) {
  auto bytes = EncodeDescriptor(Sample());
  auto d = DecodeDescriptor(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d.value().epoch, 99u);
  EXPECT_EQ(d.value().host_id, "boot/4026531836");
  EXPECT_EQ(d.value().generation, 0x0102030405060708u);
  EXPECT_EQ(d.value().control_memfd, 9);
  EXPECT_EQ(d.value().regions.size(), 2u);
  EXPECT_TRUE(d.value().regions[0].allocated);
  EXPECT_FALSE(d.value().regions[1].allocated);
  EXPECT_EQ(d.value().regions[1].kind, 2);
  EXPECT_EQ(d.value().regions[1].device, 1);
  EXPECT_EQ(d.value().regions[1].serial, 0x1122334455667788u);
  // Each transport's blobs come back as it wrote them, and only to it.
  const RegionDesc& ra = d.value().regions[0];
  const RegionDesc& rb = d.value().regions[1];
  EXPECT_EQ(d.value().BlobOf(ra, "shm"), std::string("\x07\0\0\0", 4));
  EXPECT_EQ(d.value().BlobOf(ra, "tcp"), "");
  EXPECT_EQ(d.value().BlobOf(rb, "tcp"), std::string(kMaxRegionBlob, 'h'));
  EXPECT_EQ(d.value().BlobOf(rb, "cuda_ipc"), "") << "not offered";
  EXPECT_EQ(d.value().SegmentBlobOf("shm"), "segment-wide");
  EXPECT_EQ(d.value().SegmentBlobOf("tcp"), "");
  EXPECT_TRUE(d.value().Offers("shm"));
  EXPECT_FALSE(d.value().Offers("cuda_ipc"));
  EXPECT_NE(d.value().Find(0x1000, 0x1000), nullptr);
  EXPECT_EQ(d.value().Find(0x1fff, 2), nullptr);  // crosses the end
  EXPECT_EQ(d.value().Find(0x2000, 1), nullptr);  // gap
  EXPECT_EQ(d.value().Find(0x3050, 0xb0)->addr, 0x3000u);
  EXPECT_EQ(d.value().Find(0x3000, 0), nullptr);
  EXPECT_EQ(d.value().Find(~0ull - 4, 10), nullptr);  // wraps
}

TEST(Descriptor, EveryTruncationAndCorruptionIsRejected) {
  auto bytes = EncodeDescriptor(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(DecodeDescriptor(bytes.data(), n).status().code(), StatusCode::kProtocolError) << n;
  }
  auto extra = bytes;
  extra.push_back(0);
  EXPECT_FALSE(DecodeDescriptor(extra.data(), extra.size()).ok());
  SegmentDescriptor overlap = Sample();
  overlap.regions[1].addr = 0x1800;
  auto ob = EncodeDescriptor(overlap);
  EXPECT_FALSE(DecodeDescriptor(ob.data(), ob.size()).ok());
  SegmentDescriptor kind = Sample();
  kind.regions[0].kind = 3;  // no such memory kind
  auto kb = EncodeDescriptor(kind);
  EXPECT_FALSE(DecodeDescriptor(kb.data(), kb.size()).ok());
  SegmentDescriptor blob = Sample();
  blob.regions[1].blobs[0] = std::string(kMaxRegionBlob + 1, 'h');  // over a transport's limit
  auto bb = EncodeDescriptor(blob);
  EXPECT_FALSE(DecodeDescriptor(bb.data(), bb.size()).ok());
  SegmentDescriptor zero = Sample();
  zero.epoch = 0;
  auto zb = EncodeDescriptor(zero);
  EXPECT_FALSE(DecodeDescriptor(zb.data(), zb.size()).ok());
  // A region count far beyond the bytes present must not allocate or read past.
  std::vector<uint8_t> huge = EncodeDescriptor(SegmentDescriptor{1, "h", 1, 0, -1, {}, {}, {}});
  huge[huge.size() - 1] = 0x7f;
  EXPECT_FALSE(DecodeDescriptor(huge.data(), huge.size()).ok());
}

// A peer of another descriptor format is refused by name, not misread.
TEST(Descriptor, OtherFormatsAreRefusedClearly) {
  auto bytes = EncodeDescriptor(Sample());
  ASSERT_EQ(bytes[3], '0' + kDescriptorFormat);
  bytes[3] = '3';  // the format before per-transport blobs
  auto old = DecodeDescriptor(bytes.data(), bytes.size());
  EXPECT_EQ(old.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(old.status().message().find("format 3"), std::string::npos) << old.status().ToString();
  bytes[0] = 'X';
  EXPECT_NE(DecodeDescriptor(bytes.data(), bytes.size()).status().message().find("wrong magic"),
            std::string::npos);
}

TEST(MemoryRegistry, OverlapsAreRejectedAndContainsIsExact) {
  MemoryRegistry reg;
  ASSERT_TRUE(reg.Add(R(0x10000, 0x1000)).ok());
  EXPECT_EQ(reg.Add(R(0x10000, 1)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0xffff, 2)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0x10fff, 5)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0x8000, 0x10000)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add(R(0x20000, 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.Add(R(~0ull - 10, 100)).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(reg.Add(R(0x11000, 0x1000)).ok());  // adjacent
  EXPECT_TRUE(reg.Find(0x10000, 0x1000).has_value());
  EXPECT_TRUE(reg.Find(0x10fff, 1).has_value());
  EXPECT_FALSE(reg.Find(0x10fff, 2).has_value());  // spans two registrations
  EXPECT_FALSE(reg.Find(0xfff, 1).has_value());
  EXPECT_FALSE(reg.Find(0x10000, 0).has_value());
  EXPECT_FALSE(reg.Find(0x10000, ~0ull).has_value());
  EXPECT_EQ(reg.Remove(0x10001, false).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(reg.Remove(0x10000, true).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(reg.Find(0x10000, 1).has_value()) << "a refused removal leaves the region";
  EXPECT_TRUE(reg.Remove(0x10000, false).ok());
  EXPECT_FALSE(reg.Find(0x10000, 1).has_value());
  EXPECT_EQ(reg.Snapshot().size(), 1u);
}

TEST(SegmentName, Parsing) {
  auto a = ParseSegmentName("127.0.0.1:5000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().host, "127.0.0.1");
  EXPECT_EQ(a.value().port, 5000);
  auto v6 = ParseSegmentName("[::1]:7");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6.value().host, "::1");
  for (const char* bad : {"", ":", "1.2.3.4", "1.2.3.4:", ":80", "1.2.3.4:0", "1.2.3.4:65536",
                          "1.2.3.4:8x", "host:80", "1.2.3.4:-1"}) {
    EXPECT_EQ(ParseSegmentName(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(BatchState, CountsTasksAndReportsTheFirstError) {
  auto b = std::make_shared<BatchState>(3);
  b->Plan(0, 2, "tcp");
  b->Plan(1, 1, "shm");
  b->FailRequest(2, Status(StatusCode::kUnavailable, "down"));
  EXPECT_FALSE(b->Poll().done());
  b->TaskDone(0, Status::Ok());
  EXPECT_FALSE(b->Result(0).done);
  b->TaskDone(0, Status(StatusCode::kTimeout, "late"));
  EXPECT_TRUE(b->Result(0).done);
  EXPECT_EQ(b->Result(0).status.code(), StatusCode::kTimeout);
  EXPECT_FALSE(b->WaitDone(Deadline::After(Millis(10))));
  b->TaskDone(1, Status::Ok());
  EXPECT_TRUE(b->WaitDone(Deadline::After(Millis(10))));
  BatchStatus s = b->Poll();
  EXPECT_EQ(s.succeeded, 1u);
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(s.first_error.code(), StatusCode::kUnavailable);
  EXPECT_EQ(b->Result(1).transport, "shm");
  EXPECT_EQ(b->Result(5).transport, kNoTransport);
  EXPECT_EQ(b->Result(5).status.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(b->WaitQuiescent(Deadline::After(Millis(10))));
}

// A Wake runs the job at once, and says so; without one, the period decides.
TEST(Ticker, WakeRunsTheJobAndThePeriodCanChange) {
  std::atomic<int> woken{0}, timed{0};
  Ticker t("test-ticker", std::chrono::hours(1), [&](bool w) { (w ? woken : timed).fetch_add(1); });
  t.Start();
  auto within = [](auto&& cond) {
    for (int i = 0; i < 1000 && !cond(); ++i) std::this_thread::sleep_for(Millis(5));
    return cond();
  };
  t.Wake();
  EXPECT_TRUE(within([&] { return t.runs() >= 1; })) << "a Wake did not run the job";
  EXPECT_EQ(woken.load(), 1);
  EXPECT_EQ(timed.load(), 0);
  t.SetPeriod(Millis(1));
  t.Wake();  // ends the hour-long wait; the next ones take the new period
  EXPECT_TRUE(within([&] { return timed.load() >= 3; })) << "the new period did not apply";
}

std::string ThisThreadName() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// Ferry's threads carry names, cut to the kernel's 15 characters.
TEST(ThreadNames, PoolsAndTickersNameTheirThreads) {
  std::promise<std::string> pool_name, ticker_name;
  {
    ThreadPool pool(1, "test-pool-with-a-long-name");
    pool.Post([&] { pool_name.set_value(ThisThreadName()); });
    std::atomic<bool> named{false};
    Ticker t("test-ticker", std::chrono::hours(1), [&](bool) {
      if (!named.exchange(true)) ticker_name.set_value(ThisThreadName());
    });
    t.Start();
    t.Wake();
    EXPECT_EQ(ticker_name.get_future().get(), "test-ticker");
  }
  EXPECT_EQ(pool_name.get_future().get(), "test-pool-with-");
}

}  // namespace
}  // namespace ferry

// Status and Result, their macros, the little-endian byte codec, and the
// environment knobs.
#include "ferry/status.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "common/bytes.h"
#include "common/env.h"
#include "common/log.h"

namespace ferry {
namespace {

Status Fails() { return Status::NotFound("nope"); }
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
  Result<int> r(Status::Timeout("late"));
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
}

TEST(Status, OneFactoryPerCodeInCodeOrder) {
  const Status all[] = {
      Status::InvalidArgument("m"),   Status::NotFound("m"),      Status::AlreadyExists("m"),
      Status::OutOfRange("m"),        Status::Timeout("m"),       Status::Cancelled("m"),
      Status::ConnectionLost("m"),    Status::ProtocolError("m"), Status::NotSupported("m"),
      Status::ResourceExhausted("m"), Status::Unavailable("m"),   Status::PeerRestarted("m"),
      Status::IoError("m"),           Status::Internal("m"),      Status::Busy("m"),
      Status::Unauthenticated("m")};
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(all[i].code(), static_cast<StatusCode>(i + 1)) << all[i].ToString();
    EXPECT_EQ(all[i].message(), "m");
  }
  EXPECT_EQ(static_cast<StatusCode>(std::size(all)), kLastStatusCode);
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

// A knob left unset is its fallback, silently, also where the fallback lies
// outside the range (-1, "not chosen"); one set out of range warns.
TEST(Env, KnobsWarnOnlyWhenSetOutOfRange) {
  std::ostringstream seen;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(seen);
  log::Get().sinks().push_back(sink);
  unsetenv("FERRY_TEST_KNOB");
  EXPECT_EQ(env::GetIntIn("FERRY_TEST_KNOB", 0, 1, -1), -1);
  EXPECT_EQ(seen.str().find("FERRY_TEST_KNOB"), std::string::npos) << seen.str();
  setenv("FERRY_TEST_KNOB", "1", 1);
  EXPECT_EQ(env::GetIntIn("FERRY_TEST_KNOB", 0, 1, -1), 1);
  setenv("FERRY_TEST_KNOB", "7", 1);
  EXPECT_EQ(env::GetIntIn("FERRY_TEST_KNOB", 0, 1, -1), -1);
  unsetenv("FERRY_TEST_KNOB");
  log::Get().sinks().pop_back();
  EXPECT_NE(seen.str().find("FERRY_TEST_KNOB: want 0 to 1"), std::string::npos) << seen.str();
}

}  // namespace
}  // namespace ferry

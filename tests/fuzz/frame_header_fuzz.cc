// The listener's frame header (transfer/frame_wire.h). Any 32 bytes either
// decode to a header that encodes back to exactly those bytes, or are
// refused with ProtocolError.
#include <cstring>

#include "fuzz.h"
#include "transfer/frame_wire.h"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Short inputs are a header's prefix, zero-filled: every input is one header.
  uint8_t in[wire::kHeaderSize] = {};
  std::memcpy(in, data, std::min(size, wire::kHeaderSize));
  auto h = wire::DecodeHeader(in);
  if (!h.ok()) {
    FUZZ_CHECK(h.status().code() == StatusCode::kProtocolError, "%s",
               h.status().ToString().c_str());
    return 0;
  }
  uint8_t out[wire::kHeaderSize];
  wire::EncodeHeader(h.value(), out);
  FUZZ_CHECK(std::memcmp(in, out, wire::kHeaderSize) == 0, "a decoded header encodes otherwise");
  return 0;
}

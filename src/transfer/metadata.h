// p2p metadata: a peer's descriptor is fetched from its own listener.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "ferry/status.h"
#include "transfer/descriptor.h"

namespace ferry {

struct SegmentAddress {
  std::string host;
  uint16_t port = 0;
};

// Parses "host:port" (IPv4 or bracketed IPv6 literal). InvalidArgument otherwise.
Result<SegmentAddress> ParseSegmentName(std::string_view name);

// Connects, asks for the descriptor and validates it; bounded by `timeout`.
// Unavailable when nobody listens, Timeout when the peer does not answer in
// time, ProtocolError for a malformed reply.
Result<SegmentDescriptor> FetchDescriptor(const SegmentAddress& addr, Millis timeout);

}  // namespace ferry

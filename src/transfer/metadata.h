// p2p metadata: a peer's descriptor is fetched from its own listener.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/auth.h"
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
// With `key`, the handshake (handshake.h) comes first. Unavailable when
// nobody listens, Timeout when the peer does not answer in time,
// ProtocolError for a malformed reply, Unauthenticated when the peer and
// this side do not hold the same secret (or only one of them holds one).
Result<SegmentDescriptor> FetchDescriptor(const SegmentAddress& addr, Millis timeout,
                                          std::shared_ptr<const auth::Key> key = nullptr);

}  // namespace ferry

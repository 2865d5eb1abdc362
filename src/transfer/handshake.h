// The listener's handshake (frame_wire.h): the proofs both sides compute,
// and the initiator's side of the exchange, shared by the tcp lanes and the
// descriptor fetch. The target's side is the listener's.
#pragma once

#include <asio.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/auth.h"
#include "ferry/status.h"

namespace ferry::handshake {

// HMAC(key, label || initiator nonce || target nonce || target epoch ||
// expected epoch), each label naming its direction, so a proof one side
// sends is never one the other side accepts. Fresh nonces on both sides
// make each proof good for one connection only: a recorded one replays
// against a challenge it was not made for.
auth::Mac TargetProof(const auth::Key& key, const auth::Nonce& initiator, const auth::Nonce& target,
                      uint64_t target_epoch, uint64_t expected_epoch);
auth::Mac InitiatorProof(const auth::Key& key, const auth::Nonce& initiator,
                         const auth::Nonce& target, uint64_t target_epoch, uint64_t expected_epoch);

struct HelloConfig {
  std::shared_ptr<const auth::Key> key;  // null: this side holds no secret
  uint64_t expected_epoch = 0;           // 0: any
  std::string peer_name;                 // for messages
  // Asked before each step after the first: false ends the exchange, and
  // `done` is not called (the caller has moved on, e.g. closed `sock`).
  std::function<bool()> current = [] { return true; };
};

// Opens the connection `sock` (connected) with a Hello: with a key, also
// the challenge and proofs, and the target must prove the key too. Calls
// done(status, target epoch) once, from a handler on the socket's executor:
// OK; PeerRestarted when the target's epoch is not the expected one;
// Unauthenticated when the target refused this side's proof (or its lack)
// or, with a key, did not prove the key itself; ConnectionLost or
// ProtocolError. Never blocks; the caller bounds it with its own deadline
// and keeps `sock` alive until `done` (or until `current` says false).
void AsyncHello(asio::ip::tcp::socket& sock, HelloConfig config,
                std::function<void(Status, uint64_t)> done);

}  // namespace ferry::handshake

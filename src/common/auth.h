// The cluster secret: one key that every engine, master, node and client of
// a deployment holds, so that each side of a connection proves to the other
// that it belongs without the key crossing the wire. A proof is an
// HMAC-SHA256 (OpenSSL) over a label that names the protocol and the
// direction, then the exchange's fresh nonces and fields; each protocol's
// page in docs/ lists them. The key only authenticates: nothing is
// encrypted, and frames after a handshake carry no MAC.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
// A secret shorter than this is refused: a guessable key proves nothing.
inline constexpr size_t kMinKeyBytes = 16;
inline constexpr size_t kMaxKeyBytes = 4096;
// Names the key file where no option does.
inline constexpr const char* kKeyFileEnv = "FERRY_AUTH_KEY_FILE";

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;
using Field = std::span<const uint8_t>;

inline Field AsField(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}
// `v` as 8 little-endian bytes, for a proof's fields.
std::array<uint8_t, 8> Le64(uint64_t v);

class Key {
 public:
  explicit Key(std::string secret) : secret_(std::move(secret)) {}
  ~Key();  // wipes the secret
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;

  // HMAC-SHA256 of `label` with its terminating NUL (no label is a prefix
  // of another), then `fields` in order. Should OpenSSL fail, the result
  // is all zeros and is logged: a proof that verifies nowhere.
  Mac Sign(std::string_view label, std::initializer_list<Field> fields) const;
  // Whether `mac` is Sign(label, fields), compared in constant time.
  bool Verify(const Mac& mac, std::string_view label, std::initializer_list<Field> fields) const;

 private:
  std::string secret_;
};

// The key configured: read from `path` when it is set, else from the file
// $FERRY_AUTH_KEY_FILE names; null when neither is set. The secret is the
// file's bytes less trailing newlines. InvalidArgument, naming the file, for
// one that is missing or unreadable, not a regular file, accessible by group
// or others, or whose secret is empty, shorter than kMinKeyBytes or longer
// than kMaxKeyBytes. Blocks on the file system.
Result<std::shared_ptr<const Key>> LoadConfigured(const std::string& path);

// Whether a == b, in time independent of where they differ.
bool SameMac(const Mac& a, const Mac& b);

// kNonceBytes from OpenSSL's random generator; Internal if it has none.
Result<Nonce> NewNonce();

// Lowercase hex of `bytes`, and back: false unless `hex` is exactly
// 2 * out.size() hex digits.
std::string Hex(Field bytes);
bool FromHex(std::string_view hex, std::span<uint8_t> out);

}  // namespace ferry::auth

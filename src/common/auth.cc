#include "common/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/env.h"
#include "common/log.h"

namespace ferry::auth {

std::array<uint8_t, 8> Le64(uint64_t v) {
  std::array<uint8_t, 8> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
  return out;
}

Key::~Key() { OPENSSL_cleanse(secret_.data(), secret_.size()); }

Mac Key::Sign(std::string_view label, std::initializer_list<Field> fields) const {
  std::vector<uint8_t> msg(label.begin(), label.end());
  msg.push_back(0);
  for (Field f : fields) msg.insert(msg.end(), f.begin(), f.end());
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()), msg.data(), msg.size(),
           mac.data(), &len) == nullptr ||
      len != mac.size()) {
    FERRY_LOG_ERROR("auth: HMAC-SHA256 failed; this proof verifies nowhere");
    mac.fill(0);
  }
  return mac;
}

bool Key::Verify(const Mac& mac, std::string_view label,
                 std::initializer_list<Field> fields) const {
  return SameMac(Sign(label, fields), mac);
}

bool SameMac(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Result<std::shared_ptr<const Key>> LoadConfigured(const std::string& path) {
  std::string file = path;
  std::string from = "auth key file";
  if (file.empty()) {
    auto v = env::Get(kKeyFileEnv);
    if (!v) return std::shared_ptr<const Key>();
    file = *v;
    from = kKeyFileEnv;
  }
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(from + " '" + file + "' " + why);
  };
  // Non-blocking, so that a FIFO put there cannot hang the start.
  const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return bad(std::string("cannot be read: ") + std::strerror(errno));
  struct stat st {};
  std::string secret;
  Status err = Status::Ok();
  if (fstat(fd, &st) != 0) {
    err = bad(std::string("cannot be read: ") + std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    err = bad("is not a regular file");
  } else if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    err = bad(fmt::format("is accessible by group or others (mode {:04o}); chmod 600 it",
                          st.st_mode & 07777));
  } else if (static_cast<uint64_t>(st.st_size) > kMaxKeyBytes + 2) {
    err = bad("is longer than " + std::to_string(kMaxKeyBytes) + " bytes");
  } else {
    secret.resize(kMaxKeyBytes + 3);
    size_t got = 0;
    while (got < secret.size()) {
      const ssize_t n = read(fd, secret.data() + got, secret.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = bad(std::string("cannot be read: ") + std::strerror(errno));
        break;
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    secret.resize(got);
  }
  close(fd);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (err.ok()) {
    if (secret.empty()) {
      err = bad("is empty");
    } else if (secret.size() < kMinKeyBytes || secret.size() > kMaxKeyBytes) {
      err = bad("holds a " + std::to_string(secret.size()) + "-byte secret; it needs " +
                std::to_string(kMinKeyBytes) + " to " + std::to_string(kMaxKeyBytes) +
                " (e.g. `openssl rand -hex 32`)");
    }
  }
  if (!err.ok()) {
    OPENSSL_cleanse(secret.data(), secret.size());
    return err;
  }
  return std::shared_ptr<const Key>(std::make_shared<Key>(std::move(secret)));
}

Result<Nonce> NewNonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    return Status::Internal("no random bytes for an authentication nonce");
  }
  return n;
}

std::string Hex(Field bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

bool FromHex(std::string_view hex, std::span<uint8_t> out) {
  if (hex.size() != out.size() * 2) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

}  // namespace ferry::auth

// What a Store forwards to: an embedded node and master in this process
// (store.cc), or the host's node over its Unix socket (attached.cc). Every
// operation is a batch with one result per key, in order.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/store.h"
#include "store/node/core.h"

namespace ferry {

// What both forms answer for a PutFrom/GetInto buffer outside registered memory.
inline Status NotRegistered() {
  return Status::InvalidArgument("buffer is not inside a registered buffer");
}

class Store::Impl {
 public:
  virtual ~Impl() = default;

  virtual const std::string& segment() const = 0;
  virtual const std::string& master_address() const = 0;

  virtual Status RegisterBuffer(void* data, size_t size) = 0;
  virtual Status UnregisterBuffer(void* data) = 0;
  virtual Result<std::shared_ptr<StoreMemory>> AllocateBuffer(size_t size) = 0;

  // `registered`: PutFrom/GetInto, whose buffers must lie inside registered
  // memory (InvalidArgument per item otherwise).
  virtual std::vector<Status> Put(std::span<const std::string> keys,
                                  std::span<const store::Source> values, const PutOptions& options,
                                  bool registered) = 0;
  virtual std::vector<Result<size_t>> Get(std::span<const std::string> keys,
                                          std::span<store::Sink> sinks, bool registered,
                                          const GetOptions& options) = 0;
  virtual std::vector<Status> Exists(std::span<const std::string> keys) = 0;
  virtual std::vector<Status> Remove(std::span<const std::string> keys, bool force) = 0;
  virtual std::vector<Status> Pin(std::span<const std::string> keys, StorePin pin,
                                  std::chrono::milliseconds ttl) = 0;
  virtual std::vector<Result<ObjectLocation>> Locate(std::span<const std::string> keys) = 0;
  virtual Result<StoreStats> Stats() = 0;
  virtual Result<uint64_t> RemoveAll(bool force) = 0;

  // Attached only: its Impl, built by Store::Attach.
  static Result<std::unique_ptr<Impl>> Attach(const std::string& path, const StoreOptions& options);
};

}  // namespace ferry

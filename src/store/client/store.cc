// ferry::Store: the public facade, and the embedded store (a node, and with
// no master address a master too, in this process).
#include "ferry/store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>

#include "common/auth.h"
#include "store/client/store_impl.h"
#include "store/client/testing.h"
#include "store/master/service.h"
#include "store/node/core.h"
#include "store/node/node.h"
#include "store/rpc/master_client.h"

namespace ferry {
namespace {

using store::Sink;
using store::Source;

class EmbeddedStore final : public Store::Impl {
 public:
  static Result<std::unique_ptr<Store::Impl>> Create(const StoreOptions& options,
                                                     Millis read_delay) {
    if (options.replicas == 0) {
      return Status::InvalidArgument("replicas must be at least 1");
    }
    auto s = std::make_unique<EmbeddedStore>();
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const auth::Key> key,
                           auth::LoadConfigured(options.auth_key_file));
    if (options.master.empty()) {
      store::MasterServerOptions mo;
      mo.http_port = -1;
      mo.auth_key_file = options.auth_key_file;
      mo.master.lease = options.lease;
      mo.master.put_timeout = options.put_timeout;
      mo.master.node_ttl = options.node_ttl;
      FERRY_ASSIGN_OR_RETURN(s->master_server_, store::MasterServer::Start(mo));
      s->master_address_ = s->master_server_->address();
    } else {
      s->master_address_ = options.master;
    }
    EngineOptions eo = options.engine;
    if (eo.auth_key_file.empty()) eo.auth_key_file = options.auth_key_file;
    FERRY_ASSIGN_OR_RETURN(s->engine_, Engine::Create(std::move(eo)));
    if (s->master_server_ != nullptr) {
      FERRY_ASSIGN_OR_RETURN(
          s->client_,
          store::MasterClient::Connect(s->master_address_, s->master_server_->InProcessService(),
                                       options.rpc_timeout, key));
    } else {
      FERRY_ASSIGN_OR_RETURN(
          s->client_, store::MasterClient::Connect(s->master_address_, options.rpc_timeout, key));
    }
    if (options.local_memory > 0) {
      store::NodeOptions no;
      no.master = s->master_address_;
      no.segment_size = options.local_memory;
      no.heartbeat = options.heartbeat;
      no.rpc_timeout = options.rpc_timeout;
      no.key = key;
      FERRY_ASSIGN_OR_RETURN(s->node_, store::StoreNode::Start(*s->engine_, no, true));
    }
    s->core_ = std::make_unique<store::StoreCore>(
        *s->engine_, *s->client_, s->node_.get(),
        store::CoreOptions{options.replicas, options.prefer_local, read_delay,
                           options.reserve_bytes});
    return std::unique_ptr<Store::Impl>(std::move(s));
  }

  const std::string& segment() const override { return engine_->name(); }
  const std::string& master_address() const override { return master_address_; }

  Status RegisterBuffer(void* data, size_t size) override { return core_->Register(data, size); }

  Status UnregisterBuffer(void* data) override {
    FERRY_RETURN_IF_ERROR(core_->Unregister(data));
    std::lock_guard lock(mem_mu_);
    allocated_.erase(data);
    return Status::Ok();
  }

  Result<std::shared_ptr<StoreMemory>> AllocateBuffer(size_t size) override {
    FERRY_ASSIGN_OR_RETURN(auto mem, StoreMemory::Create(size));
    FERRY_RETURN_IF_ERROR(core_->Register(mem->data(), mem->size()));
    std::lock_guard lock(mem_mu_);
    allocated_[mem->data()] = mem;
    return mem;
  }

  std::vector<Status> Put(std::span<const std::string> keys, std::span<const Source> values,
                          const PutOptions& options, bool registered) override {
    std::vector<Status> pre(keys.size());
    for (size_t i = 0; registered && i < keys.size() && i < values.size(); ++i) {
      if (!core_->Registered(values[i].parts)) pre[i] = NotRegistered();
    }
    return core_->Put(keys, values, options, std::move(pre));
  }

  std::vector<Result<size_t>> Get(std::span<const std::string> keys, std::span<Sink> sinks,
                                  bool registered, const GetOptions& options) override {
    std::vector<bool> bad(keys.size(), false);
    for (size_t i = 0; registered && i < keys.size(); ++i) {
      if (sinks[i].parts.empty() || !core_->Registered(sinks[i].parts)) {
        bad[i] = true;
        sinks[i] = Sink{};  // a zero-capacity sink: the core does not write it
      }
    }
    auto out = core_->Get(keys, sinks, options.stream, options.expect_prefix);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (bad[i]) out[i] = NotRegistered();
    }
    return out;
  }

  std::vector<Status> Exists(std::span<const std::string> keys) override {
    return core_->Exists(keys);
  }
  std::vector<Status> Remove(std::span<const std::string> keys, bool force) override {
    return core_->Remove(keys, force);
  }
  std::vector<Status> Pin(std::span<const std::string> keys, StorePin pin,
                          std::chrono::milliseconds ttl) override {
    return core_->Pin(keys, pin, ttl);
  }
  std::vector<Result<ObjectLocation>> Locate(std::span<const std::string> keys) override {
    return core_->Locate(keys);
  }
  Result<StoreStats> Stats() override { return core_->Stats(); }
  Result<uint64_t> RemoveAll(bool force) override { return core_->RemoveAll(force); }

 private:
  // Destroyed in reverse: the core first (it sends the last lease releases),
  // then the node, which unmounts, before the engine they use goes.
  std::unique_ptr<store::MasterServer> master_server_;  // in-process master, if any
  std::string master_address_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<store::MasterClient> client_;
  std::unique_ptr<store::StoreNode> node_;  // embedded node, if any
  std::unique_ptr<store::StoreCore> core_;

  std::mutex mem_mu_;
  std::unordered_map<void*, std::shared_ptr<StoreMemory>> allocated_;  // guarded by mem_mu_
};

}  // namespace

StoreMemory::~StoreMemory() {
  munmap(data_, size_);
  close(fd_);
}

Result<std::shared_ptr<StoreMemory>> StoreMemory::Create(size_t size) {
  if (size == 0) return Status::InvalidArgument("a buffer needs at least one byte");
  int fd = memfd_create("ferry-store-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno(errno, "memfd_create");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status st = Status::FromErrno(errno, "ftruncate");
    close(fd);
    return st;
  }
  // Populated now, so that no first touch on a data path faults, here or in
  // the node that maps it too. The size can no longer shrink under a mapping.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    Status st = Status::FromErrno(errno, "mmap");
    close(fd);
    return st;
  }
  (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL);
  return std::make_shared<StoreMemory>(fd, p, size);
}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::Create(StoreOptions options) {
  FERRY_ASSIGN_OR_RETURN(auto impl, EmbeddedStore::Create(options, Millis(0)));
  return std::make_unique<Store>(std::move(impl));
}

namespace store::testing {

Result<std::unique_ptr<Store>> CreateWithReadDelay(StoreOptions options, Millis delay) {
  FERRY_ASSIGN_OR_RETURN(auto impl, EmbeddedStore::Create(options, delay));
  return std::make_unique<Store>(std::move(impl));
}

}  // namespace store::testing

Result<std::unique_ptr<Store>> Store::Attach(const std::string& socket_path, StoreOptions options) {
  FERRY_ASSIGN_OR_RETURN(auto impl, Impl::Attach(socket_path, options));
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

const std::string& Store::segment() const { return impl_->segment(); }
const std::string& Store::master_address() const { return impl_->master_address(); }

Status Store::RegisterBuffer(void* data, size_t size) { return impl_->RegisterBuffer(data, size); }
Status Store::UnregisterBuffer(void* data) { return impl_->UnregisterBuffer(data); }
Result<std::shared_ptr<StoreMemory>> Store::AllocateBuffer(size_t size) {
  return impl_->AllocateBuffer(size);
}
Result<StoreStats> Store::Stats() { return impl_->Stats(); }
Result<uint64_t> Store::RemoveAll(bool force) { return impl_->RemoveAll(force); }

Status Store::Put(std::string_view key, std::span<const uint8_t> value, const PutOptions& o) {
  std::string k(key);
  const Source src = Source::Of(value.data(), value.size());
  return impl_->Put({&k, 1}, {&src, 1}, o, false)[0];
}

Result<std::vector<uint8_t>> Store::Get(std::string_view key) {
  auto r = BatchGet(std::vector<std::string>{std::string(key)});
  return std::move(r[0]);
}

Status Store::PutFrom(std::string_view key, StoreBuffer buffer, const PutOptions& o) {
  return BatchPutFrom(std::vector<std::string>{std::string(key)}, {&buffer, 1}, o)[0];
}

Result<size_t> Store::GetInto(std::string_view key, StoreBuffer buffer, const GetOptions& o) {
  return BatchGetInto(std::vector<std::string>{std::string(key)}, {&buffer, 1}, o)[0];
}

Status Store::Exists(std::string_view key) {
  return BatchExists(std::vector<std::string>{std::string(key)})[0];
}

Status Store::Remove(std::string_view key, bool force) {
  return BatchRemove(std::vector<std::string>{std::string(key)}, force)[0];
}

Result<ObjectLocation> Store::Locate(std::string_view key) {
  return std::move(BatchLocate(std::vector<std::string>{std::string(key)})[0]);
}

Status Store::Pin(std::string_view key, StorePin pin, std::chrono::milliseconds ttl) {
  return BatchPin(std::vector<std::string>{std::string(key)}, pin, ttl)[0];
}

std::vector<Status> Store::BatchPut(std::span<const std::string> keys,
                                    std::span<const std::span<const uint8_t>> values,
                                    const PutOptions& o) {
  std::vector<Source> src;
  for (const auto& v : values) src.push_back(Source::Of(v.data(), v.size()));
  return impl_->Put(keys, src, o, false);
}

std::vector<Result<std::vector<uint8_t>>> Store::BatchGet(std::span<const std::string> keys) {
  std::vector<std::vector<uint8_t>> vals(keys.size());
  std::vector<Sink> sinks(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) sinks[i].vec = &vals[i];
  auto got = impl_->Get(keys, sinks, false, {});
  std::vector<Result<std::vector<uint8_t>>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out.push_back(got[i].ok() ? Result<std::vector<uint8_t>>(std::move(vals[i]))
                              : Result<std::vector<uint8_t>>(got[i].status()));
  }
  return out;
}

namespace {

std::vector<store::Part> Parts(std::span<const StoreBuffer> buffers) {
  std::vector<store::Part> parts;
  for (const auto& b : buffers) parts.push_back({static_cast<uint8_t*>(b.data), b.size});
  return parts;
}

std::vector<Source> Sources(std::span<const std::vector<StoreBuffer>> lists) {
  std::vector<Source> src;
  for (const auto& l : lists) src.push_back({Parts(l)});
  return src;
}

// One sink per key; keys without buffers get none (they fail as unregistered).
std::vector<Sink> Sinks(size_t keys, std::span<const std::vector<StoreBuffer>> lists) {
  std::vector<Sink> sinks(keys);
  for (size_t i = 0; i < keys && i < lists.size(); ++i) sinks[i].parts = Parts(lists[i]);
  return sinks;
}

std::vector<std::vector<StoreBuffer>> Singles(std::span<const StoreBuffer> buffers) {
  std::vector<std::vector<StoreBuffer>> out;
  for (const auto& b : buffers) out.push_back({b});
  return out;
}

}  // namespace

std::vector<Status> Store::BatchPutFrom(std::span<const std::string> keys,
                                        std::span<const StoreBuffer> buffers, const PutOptions& o) {
  return impl_->Put(keys, Sources(Singles(buffers)), o, true);
}

std::vector<Result<size_t>> Store::BatchGetInto(std::span<const std::string> keys,
                                                std::span<const StoreBuffer> buffers,
                                                const GetOptions& o) {
  auto sinks = Sinks(keys.size(), Singles(buffers));
  return impl_->Get(keys, sinks, true, o);
}

std::vector<Status> Store::BatchPutParts(std::span<const std::string> keys,
                                         std::span<const std::vector<StoreBuffer>> parts,
                                         const PutOptions& o) {
  return impl_->Put(keys, Sources(parts), o, false);
}

std::vector<Status> Store::BatchPutFromMulti(std::span<const std::string> keys,
                                             std::span<const std::vector<StoreBuffer>> buffers,
                                             const PutOptions& o) {
  return impl_->Put(keys, Sources(buffers), o, true);
}

std::vector<Result<size_t>> Store::BatchGetIntoParts(
    std::span<const std::string> keys, std::span<const std::vector<StoreBuffer>> parts,
    const GetOptions& o) {
  auto sinks = Sinks(keys.size(), parts);
  return impl_->Get(keys, sinks, false, o);
}

std::vector<Result<size_t>> Store::BatchGetIntoMulti(
    std::span<const std::string> keys, std::span<const std::vector<StoreBuffer>> buffers,
    const GetOptions& o) {
  auto sinks = Sinks(keys.size(), buffers);
  return impl_->Get(keys, sinks, true, o);
}

std::vector<Status> Store::BatchExists(std::span<const std::string> keys) {
  return impl_->Exists(keys);
}
std::vector<Status> Store::BatchRemove(std::span<const std::string> keys, bool force) {
  return impl_->Remove(keys, force);
}
std::vector<Status> Store::BatchPin(std::span<const std::string> keys, StorePin pin,
                                    std::chrono::milliseconds ttl) {
  return impl_->Pin(keys, pin, ttl);
}
std::vector<Result<ObjectLocation>> Store::BatchLocate(std::span<const std::string> keys) {
  return impl_->Locate(keys);
}

}  // namespace ferry

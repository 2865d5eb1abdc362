// ferry._ferry.Store: ferry::Store as seen from Python. Marshalling only, as in
// ferry_py.cc: pointers travel as ints, keys as std::string (str or bytes),
// every call that can block releases the GIL, a single-item failure raises
// ferry.errors' class, and batch calls return one (code, message[, value])
// tuple per item for ferry/store.py to map. Key and buffer checks are the
// C++ Store's.
//
// Built with -DFERRY_NO_STORE (python/build-ext.sh without libferry_store.a)
// the module has no Store, and ferry.Store says so.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ferry/status.h"
#include "ferry/store.h"
#include "py_status.h"

namespace py = pybind11;

#ifdef FERRY_NO_STORE

void RegisterStore(py::module_&) {}

#else

using ferry_py::Addr;
using ferry_py::Check;
using ferry_py::NoGil;
using ferry_py::Ptr;
using ferry_py::RaiseInvalid;
using ferry_py::Take;

namespace {

using Millis = std::chrono::milliseconds;
using Keys = std::vector<std::string>;
using Range = std::pair<uint64_t, uint64_t>;  // (address, length)
// Per item: (code, "Code: message"), code 0 and "" when it succeeded.
using StatusTuple = std::tuple<int, std::string>;

StatusTuple ToTuple(const ferry::Status& st) {
  return {static_cast<int>(st.code()), st.ok() ? std::string() : st.ToString()};
}

std::vector<StatusTuple> ToTuples(const std::vector<ferry::Status>& in) {
  std::vector<StatusTuple> out;
  out.reserve(in.size());
  for (const auto& st : in) out.push_back(ToTuple(st));
  return out;
}

ferry::StorePin ToPin(int pin) {
  if (pin < 0 || pin > 2) RaiseInvalid("pin must be 0 (none), 1 (soft) or 2 (hard)");
  return static_cast<ferry::StorePin>(pin);
}

ferry::PutOptions ToPutOptions(uint32_t replicas, std::string preferred, int pin,
                               int64_t pin_ttl_ms, uint64_t stream = 0) {
  ferry::PutOptions o;
  o.stream = Ptr(stream);  // a cudaStream_t for registered GPU memory; 0: legacy default
  o.replicas = replicas;   // 0: the Store's default
  o.preferred_segment = std::move(preferred);
  o.pin = ToPin(pin);
  o.pin_ttl = Millis(pin_ttl_ms);
  return o;
}

template <typename T>
void CheckSameLength(const Keys& keys, const std::vector<T>& items) {
  if (keys.size() != items.size()) RaiseInvalid("as many buffers as keys are needed");
}

std::vector<ferry::StoreBuffer> ToBuffers(const std::vector<Range>& in) {
  std::vector<ferry::StoreBuffer> out;
  out.reserve(in.size());
  for (const auto& [addr, len] : in) out.push_back({Ptr(addr), static_cast<size_t>(len)});
  return out;
}

std::vector<std::vector<ferry::StoreBuffer> > ToBufferLists(
    const std::vector<std::vector<Range> >& in) {
  std::vector<std::vector<ferry::StoreBuffer> > out;
  out.reserve(in.size());
  for (const auto& l : in) out.push_back(ToBuffers(l));
  return out;
}

// (code, message, bytes written) per key.
std::vector<std::tuple<int, std::string, uint64_t> > SizeTuples(
    const std::vector<ferry::Result<size_t> >& got) {
  std::vector<std::tuple<int, std::string, uint64_t> > out;
  out.reserve(got.size());
  for (const auto& r : got) {
    const auto [code, text] = ToTuple(r.status());
    out.emplace_back(code, text, r.ok() ? r.value() : 0);
  }
  return out;
}

ferry::GetOptions ToGetOptions(uint64_t stream) {
  ferry::GetOptions o;
  o.stream = Ptr(stream);
  return o;
}

class PyStore {
 public:
  explicit PyStore(std::unique_ptr<ferry::Store> s) : store_(std::move(s)) {}
  ~PyStore() { Close(); }

  // Drops this object's reference, with the GIL released. A call still in
  // flight on another thread holds its own; the store ends when that returns.
  void Close() {
    if (!store_) return;
    std::shared_ptr<ferry::Store> s = std::move(store_);
    py::gil_scoped_release nogil;
    s.reset();
  }

  ferry::Store& Get() const {
    if (!store_) RaiseInvalid("the store is closed");
    return *store_;
  }

  // Runs f(store) with the GIL released. The call holds its own reference, so
  // a close() from another thread meanwhile cannot free the store under it;
  // whichever drops the last reference destroys it, without the GIL.
  template <typename F>
  auto Call(F&& f) {
    Get();
    std::shared_ptr<ferry::Store> held = store_;
    py::gil_scoped_release nogil;
    std::shared_ptr<ferry::Store> s = std::move(held);  // destroyed first, GIL released
    return f(*s);
  }

 private:
  std::shared_ptr<ferry::Store> store_;
};

std::unique_ptr<PyStore> CreateStore(const std::string& master, uint64_t local_memory,
                                     uint32_t replicas, bool prefer_local, const std::string& host,
                                     int port, const std::string& transport, int64_t rpc_timeout_ms,
                                     int64_t lease_ms, int64_t put_timeout_ms, int64_t node_ttl_ms,
                                     const std::string& auth_key_file, int64_t reserve_bytes) {
  if (port < 0 || port > 65535) RaiseInvalid("port must be in [0, 65535]");
  ferry::StoreOptions o;
  o.master = master;
  o.auth_key_file = auth_key_file;
  o.local_memory = local_memory;
  o.replicas = replicas;
  o.prefer_local = prefer_local;
  o.engine.host = host;
  o.engine.port = static_cast<uint16_t>(port);
  o.engine.transport = transport;
  // Zero keeps the C++ default for each timeout.
  if (rpc_timeout_ms > 0) o.rpc_timeout = Millis(rpc_timeout_ms);
  if (lease_ms > 0) o.lease = Millis(lease_ms);
  if (put_timeout_ms > 0) o.put_timeout = Millis(put_timeout_ms);
  if (node_ttl_ms > 0) o.node_ttl = Millis(node_ttl_ms);
  if (reserve_bytes >= 0) o.reserve_bytes = static_cast<uint64_t>(reserve_bytes);
  return std::make_unique<PyStore>(Take(NoGil([&] { return ferry::Store::Create(std::move(o)); })));
}

std::unique_ptr<PyStore> AttachStore(const std::string& path, int64_t rpc_timeout_ms,
                                     uint64_t staging_bytes, int readiness,
                                     const std::string& auth_key_file) {
  if (readiness != 0 && readiness != 1) RaiseInvalid("readiness is 0 (sync) or 1 (event)");
  ferry::StoreOptions o;
  o.attach_readiness = static_cast<ferry::AttachReadiness>(readiness);
  if (rpc_timeout_ms > 0) o.rpc_timeout = Millis(rpc_timeout_ms);
  if (staging_bytes > 0) o.attach_staging = staging_bytes;
  o.auth_key_file = auth_key_file;
  return std::make_unique<PyStore>(
      Take(NoGil([&] { return ferry::Store::Attach(path, std::move(o)); })));
}

py::bytes ToBytes(const std::vector<uint8_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

}  // namespace

void RegisterStore(py::module_& m) {
  // Memory from allocate_buffer: the mapping lives as long as this object (the
  // shared_ptr) and every memoryview of it.
  py::class_<ferry::StoreMemory, std::shared_ptr<ferry::StoreMemory> >(m, "Memory",
                                                                       py::buffer_protocol())
      .def_buffer([](ferry::StoreMemory& mem) {
        return py::buffer_info(mem.data(), 1, "B", 1, {static_cast<py::ssize_t>(mem.size())}, {1},
                               /*readonly=*/false);
      })
      .def_property_readonly("address",
                             [](const ferry::StoreMemory& mem) { return Addr(mem.data()); })
      .def_property_readonly("nbytes", [](const ferry::StoreMemory& mem) { return mem.size(); });

  py::class_<PyStore>(m, "Store")
      .def_static("create", &CreateStore, py::arg("master") = "",
                  py::arg("local_memory") = uint64_t{256} << 20, py::arg("replicas") = 1,
                  py::arg("prefer_local") = true, py::arg("host") = "127.0.0.1",
                  py::arg("port") = 0, py::arg("transport") = "", py::arg("rpc_timeout_ms") = 0,
                  py::arg("lease_ms") = 0, py::arg("put_timeout_ms") = 0,
                  py::arg("node_ttl_ms") = 0, py::arg("auth_key_file") = "",
                  py::arg("reserve_bytes") = -1)
      .def_static("attach", &AttachStore, py::arg("path"), py::arg("rpc_timeout_ms") = 0,
                  py::arg("staging_bytes") = 0, py::arg("readiness") = 0,
                  py::arg("auth_key_file") = "")
      .def("close", &PyStore::Close)
      .def_property_readonly("segment", [](const PyStore& s) { return s.Get().segment(); })
      .def_property_readonly("master_address",
                             [](const PyStore& s) { return s.Get().master_address(); })
      .def(
          "put",
          [](PyStore& s, const std::string& key, uint64_t addr, uint64_t len, uint32_t replicas,
             std::string preferred, int pin, int64_t pin_ttl_ms) {
            const ferry::PutOptions o =
                ToPutOptions(replicas, std::move(preferred), pin, pin_ttl_ms);
            const std::span<const uint8_t> value(static_cast<const uint8_t*>(Ptr(addr)), len);
            Check(s.Call([&](ferry::Store& st) { return st.Put(key, value, o); }));
          },
          py::arg("key"), py::arg("addr"), py::arg("len"), py::arg("replicas") = 0,
          py::arg("preferred") = "", py::arg("pin") = 0, py::arg("pin_ttl_ms") = 0)
      .def(
          "get",
          [](PyStore& s, const std::string& key) {
            return ToBytes(Take(s.Call([&](ferry::Store& st) { return st.Get(key); })));
          },
          py::arg("key"))
      .def(
          "put_from",
          [](PyStore& s, const std::string& key, uint64_t addr, uint64_t len, uint32_t replicas,
             std::string preferred, int pin, int64_t pin_ttl_ms, uint64_t stream) {
            const ferry::PutOptions o =
                ToPutOptions(replicas, std::move(preferred), pin, pin_ttl_ms, stream);
            const ferry::StoreBuffer buf{Ptr(addr), static_cast<size_t>(len)};
            Check(s.Call([&](ferry::Store& st) { return st.PutFrom(key, buf, o); }));
          },
          py::arg("key"), py::arg("addr"), py::arg("len"), py::arg("replicas") = 0,
          py::arg("preferred") = "", py::arg("pin") = 0, py::arg("pin_ttl_ms") = 0,
          py::arg("stream") = 0)
      .def(
          "get_into",
          [](PyStore& s, const std::string& key, uint64_t addr, uint64_t len, uint64_t stream) {
            const ferry::StoreBuffer buf{Ptr(addr), static_cast<size_t>(len)};
            const ferry::GetOptions o = ToGetOptions(stream);
            return Take(s.Call([&](ferry::Store& st) { return st.GetInto(key, buf, o); }));
          },
          py::arg("key"), py::arg("addr"), py::arg("len"), py::arg("stream") = 0)
      .def(
          "exists",
          [](PyStore& s, const std::string& key) {
            const ferry::Status st = s.Call([&](ferry::Store& store) { return store.Exists(key); });
            if (st.code() == ferry::StatusCode::kNotFound) return false;
            Check(st);
            return true;
          },
          py::arg("key"))
      .def(
          "remove",
          [](PyStore& s, const std::string& key, bool force) {
            Check(s.Call([&](ferry::Store& st) { return st.Remove(key, force); }));
          },
          py::arg("key"), py::arg("force") = false)
      .def(
          "pin",
          [](PyStore& s, const std::string& key, int pin, int64_t ttl_ms) {
            const ferry::StorePin p = ToPin(pin);
            Check(s.Call([&](ferry::Store& st) { return st.Pin(key, p, Millis(ttl_ms)); }));
          },
          py::arg("key"), py::arg("pin"), py::arg("ttl_ms") = 0)
      .def(
          "register_buffer",
          [](PyStore& s, uint64_t addr, uint64_t len) {
            Check(s.Call([&](ferry::Store& st) { return st.RegisterBuffer(Ptr(addr), len); }));
          },
          py::arg("addr"), py::arg("len"))
      .def(
          "unregister_buffer",
          [](PyStore& s, uint64_t addr) {
            Check(s.Call([&](ferry::Store& st) { return st.UnregisterBuffer(Ptr(addr)); }));
          },
          py::arg("addr"))
      .def(
          "allocate_buffer",
          [](PyStore& s, uint64_t nbytes) {
            return Take(s.Call([&](ferry::Store& st) { return st.AllocateBuffer(nbytes); }));
          },
          py::arg("nbytes"))
      .def(
          "_time_get_into",
          // The benchmark's C++ reference (python/bench/bench_store_latency.py):
          // the same GetInto as get_into, in a loop here, in this process and
          // on this store; the microseconds of each call.
          [](PyStore& s, const std::string& key, uint64_t addr, uint64_t len, int iterations) {
            const ferry::StoreBuffer buf{Ptr(addr), static_cast<size_t>(len)};
            return Take(s.Call([&](ferry::Store& st) -> ferry::Result<std::vector<double> > {
              std::vector<double> us;
              us.reserve(static_cast<size_t>(std::max(iterations, 0)));
              for (int i = 0; i < iterations; ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                auto r = st.GetInto(key, buf);
                us.push_back(
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                        .count());
                if (!r.ok()) return r.status();
              }
              return us;
            }));
          },
          py::arg("key"), py::arg("addr"), py::arg("len"), py::arg("iterations"))
      .def(
          "remove_all",
          [](PyStore& s, bool force) {
            return Take(s.Call([&](ferry::Store& st) { return st.RemoveAll(force); }));
          },
          py::arg("force") = false)
      .def("stats",
           [](PyStore& s) {
             const ferry::StoreStats st =
                 Take(s.Call([](ferry::Store& store) { return store.Stats(); }));
             py::dict d;
             d["capacity"] = st.capacity;
             d["used"] = st.used;
             d["nodes"] = st.nodes;
             d["objects"] = st.objects;
             return d;
           })
      // Batch forms: one tuple per key, in order.
      .def(
          "batch_put",
          [](PyStore& s, const Keys& keys, const std::vector<Range>& values, uint32_t replicas,
             std::string preferred, int pin, int64_t pin_ttl_ms) {
            CheckSameLength(keys, values);
            const ferry::PutOptions o =
                ToPutOptions(replicas, std::move(preferred), pin, pin_ttl_ms);
            std::vector<std::span<const uint8_t> > spans;
            spans.reserve(values.size());
            for (const auto& [addr, len] : values) {
              spans.emplace_back(static_cast<const uint8_t*>(Ptr(addr)), len);
            }
            return ToTuples(s.Call([&](ferry::Store& st) { return st.BatchPut(keys, spans, o); }));
          },
          py::arg("keys"), py::arg("values"), py::arg("replicas") = 0, py::arg("preferred") = "",
          py::arg("pin") = 0, py::arg("pin_ttl_ms") = 0)
      // (code, message, bytes or None) per key.
      .def(
          "batch_get",
          [](PyStore& s, const Keys& keys) {
            auto got = s.Call([&](ferry::Store& st) { return st.BatchGet(keys); });
            py::list out;
            for (auto& r : got) {
              if (r.ok()) {
                out.append(py::make_tuple(0, "", ToBytes(r.value())));
                std::vector<uint8_t>().swap(r.value());  // Python has its copy
              } else {
                const auto [code, text] = ToTuple(r.status());
                out.append(py::make_tuple(code, text, py::none()));
              }
            }
            return out;
          },
          py::arg("keys"))
      .def(
          "batch_put_from",
          [](PyStore& s, const Keys& keys, const std::vector<Range>& buffers, uint32_t replicas,
             std::string preferred, int pin, int64_t pin_ttl_ms, uint64_t stream) {
            CheckSameLength(keys, buffers);
            const ferry::PutOptions o =
                ToPutOptions(replicas, std::move(preferred), pin, pin_ttl_ms, stream);
            const std::vector<ferry::StoreBuffer> bufs = ToBuffers(buffers);
            return ToTuples(
                s.Call([&](ferry::Store& st) { return st.BatchPutFrom(keys, bufs, o); }));
          },
          py::arg("keys"), py::arg("buffers"), py::arg("replicas") = 0, py::arg("preferred") = "",
          py::arg("pin") = 0, py::arg("pin_ttl_ms") = 0, py::arg("stream") = 0)
      // (code, message, bytes written) per key.
      .def(
          "batch_get_into",
          [](PyStore& s, const Keys& keys, const std::vector<Range>& buffers, uint64_t stream) {
            CheckSameLength(keys, buffers);
            const std::vector<ferry::StoreBuffer> bufs = ToBuffers(buffers);
            const ferry::GetOptions o = ToGetOptions(stream);
            return SizeTuples(
                s.Call([&](ferry::Store& st) { return st.BatchGetInto(keys, bufs, o); }));
          },
          py::arg("keys"), py::arg("buffers"), py::arg("stream") = 0)
      // Multi-buffer forms: each object is the concatenation of its list.
      // batch_put_parts takes any host memory, and GPU memory (which it
      // moves through the engine or, attached, by IPC); the others need
      // registered memory.
      .def(
          "batch_put_parts",
          [](PyStore& s, const Keys& keys, const std::vector<std::vector<Range> >& parts,
             uint32_t replicas, std::string preferred, int pin, int64_t pin_ttl_ms,
             uint64_t stream) {
            CheckSameLength(keys, parts);
            const ferry::PutOptions o =
                ToPutOptions(replicas, std::move(preferred), pin, pin_ttl_ms, stream);
            const auto lists = ToBufferLists(parts);
            return ToTuples(
                s.Call([&](ferry::Store& st) { return st.BatchPutParts(keys, lists, o); }));
          },
          py::arg("keys"), py::arg("parts"), py::arg("replicas") = 0, py::arg("preferred") = "",
          py::arg("pin") = 0, py::arg("pin_ttl_ms") = 0, py::arg("stream") = 0)
      .def(
          "batch_put_from_multi",
          [](PyStore& s, const Keys& keys, const std::vector<std::vector<Range> >& buffers,
             uint32_t replicas, std::string preferred, int pin, int64_t pin_ttl_ms,
             uint64_t stream) {
            CheckSameLength(keys, buffers);
            const ferry::PutOptions o =
                ToPutOptions(replicas, std::move(preferred), pin, pin_ttl_ms, stream);
            const auto lists = ToBufferLists(buffers);
            return ToTuples(
                s.Call([&](ferry::Store& st) { return st.BatchPutFromMulti(keys, lists, o); }));
          },
          py::arg("keys"), py::arg("buffers"), py::arg("replicas") = 0, py::arg("preferred") = "",
          py::arg("pin") = 0, py::arg("pin_ttl_ms") = 0, py::arg("stream") = 0)
      .def(
          "batch_get_into_multi",
          [](PyStore& s, const Keys& keys, const std::vector<std::vector<Range> >& buffers,
             uint64_t stream, py::bytes expect) {
            CheckSameLength(keys, buffers);
            const auto lists = ToBufferLists(buffers);
            ferry::GetOptions o = ToGetOptions(stream);
            o.expect_prefix = expect;
            return SizeTuples(
                s.Call([&](ferry::Store& st) { return st.BatchGetIntoMulti(keys, lists, o); }));
          },
          py::arg("keys"), py::arg("buffers"), py::arg("stream") = 0,
          py::arg("expect") = py::bytes())
      .def(
          "batch_get_into_parts",
          [](PyStore& s, const Keys& keys, const std::vector<std::vector<Range> >& parts,
             uint64_t stream, py::bytes expect) {
            CheckSameLength(keys, parts);
            const auto lists = ToBufferLists(parts);
            ferry::GetOptions o = ToGetOptions(stream);
            o.expect_prefix = expect;
            return SizeTuples(
                s.Call([&](ferry::Store& st) { return st.BatchGetIntoParts(keys, lists, o); }));
          },
          py::arg("keys"), py::arg("parts"), py::arg("stream") = 0, py::arg("expect") = py::bytes())
      .def(
          "batch_exists",
          [](PyStore& s, const Keys& keys) {
            return ToTuples(s.Call([&](ferry::Store& st) { return st.BatchExists(keys); }));
          },
          py::arg("keys"))
      .def(
          "batch_remove",
          [](PyStore& s, const Keys& keys, bool force) {
            return ToTuples(s.Call([&](ferry::Store& st) { return st.BatchRemove(keys, force); }));
          },
          py::arg("keys"), py::arg("force") = false)
      .def(
          "batch_pin",
          [](PyStore& s, const Keys& keys, int pin, int64_t ttl_ms) {
            const ferry::StorePin p = ToPin(pin);
            return ToTuples(
                s.Call([&](ferry::Store& st) { return st.BatchPin(keys, p, Millis(ttl_ms)); }));
          },
          py::arg("keys"), py::arg("pin"), py::arg("ttl_ms") = 0);
}

#endif  // FERRY_NO_STORE

// ferry._ferry: the C++ engine as seen from Python. Marshalling only: Status
// becomes an exception from ferry.errors, every call that can block releases
// the GIL, and pointers travel as ints. Buffer resolution, streams and the
// Mooncake conventions live in the pure-Python package.
//
// Includes only Ferry's public headers and pybind11, so the extension can be
// compiled on a machine that has neither spdlog, asio nor CUDA headers
// (python/build-ext.sh).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ferry/engine.h"
#include "ferry/status.h"
#include "py_status.h"

namespace py = pybind11;

using ferry_py::Addr;
using ferry_py::Check;
using ferry_py::NoGil;
using ferry_py::Ptr;
using ferry_py::RaiseInvalid;
using ferry_py::Take;

// ferry.Store's half (store_py.cc).
void RegisterStore(py::module_& m);

namespace {

using Millis = std::chrono::milliseconds;

// (op, local, segment, remote, length), op 0 = read and 1 = write.
using RequestTuple = std::tuple<int, uint64_t, uint64_t, uint64_t, uint64_t>;

std::vector<ferry::Request> ToRequests(const std::vector<RequestTuple>& in) {
  std::vector<ferry::Request> out;
  out.reserve(in.size());
  for (const auto& [op, local, segment, remote, length] : in) {
    if (op != 0 && op != 1) RaiseInvalid("op must be 0 (read) or 1 (write)");
    out.push_back({static_cast<ferry::Op>(op), Ptr(local), segment, remote, length});
  }
  return out;
}

// The engine is shared with its batches, which must be freed before it.

class PyBatch {
 public:
  PyBatch(std::shared_ptr<ferry::Engine> engine, std::unique_ptr<ferry::Batch> batch)
      : engine_(std::move(engine)), batch_(std::move(batch)) {}
  // Freeing a batch waits until no engine thread touches its buffers.
  ~PyBatch() { Close(); }

  void Close() {
    if (!batch_) return;
    py::gil_scoped_release nogil;
    batch_.reset();
    engine_.reset();
  }
  const ferry::Batch& Get() const {
    if (!batch_) RaiseInvalid("the batch is closed");
    return *batch_;
  }
  ferry::Batch& Get() { return const_cast<ferry::Batch&>(std::as_const(*this).Get()); }

 private:
  std::shared_ptr<ferry::Engine> engine_;  // declared first: outlives batch_
  std::unique_ptr<ferry::Batch> batch_;
};

class PyEngine {
 public:
  explicit PyEngine(std::shared_ptr<ferry::Engine> e) : engine_(std::move(e)) {}
  ~PyEngine() { Close(); }
  // Stops the engine's threads once its last batch is freed.
  void Close() {
    if (!engine_) return;
    py::gil_scoped_release nogil;
    engine_.reset();
  }
  ferry::Engine& Get() const {
    if (!engine_) RaiseInvalid("the engine is closed");
    return *engine_;
  }
  const std::shared_ptr<ferry::Engine>& Shared() const {
    Get();
    return engine_;
  }

 private:
  std::shared_ptr<ferry::Engine> engine_;
};

std::unique_ptr<PyEngine> CreateEngine(const std::string& host, int port,
                                       const std::string& metadata, const std::string& transport,
                                       int tcp_lanes, uint64_t tcp_chunk_bytes,
                                       int tcp_chunks_in_flight, int tcp_gpu_lanes,
                                       uint64_t tcp_gpu_chunk_bytes, int tcp_staging_buffers,
                                       int io_threads, int copy_threads, int64_t request_timeout_ms,
                                       int64_t connect_timeout_ms, const std::string& auth_key_file,
                                       int64_t metadata_ttl_s) {
  if (port < 0 || port > 65535) RaiseInvalid("port must be in [0, 65535]");
  ferry::EngineOptions o;
  o.host = host;
  o.port = static_cast<uint16_t>(port);
  o.metadata = metadata;
  o.transport = transport;
  // Zero keeps the C++ default for each knob.
  if (tcp_lanes > 0) o.tcp_lanes = tcp_lanes;
  if (tcp_chunk_bytes > 0) o.tcp_chunk_bytes = tcp_chunk_bytes;
  if (tcp_chunks_in_flight > 0) o.tcp_chunks_in_flight = tcp_chunks_in_flight;
  if (tcp_gpu_lanes > 0) o.tcp_gpu_lanes = tcp_gpu_lanes;
  if (tcp_gpu_chunk_bytes > 0) o.tcp_gpu_chunk_bytes = tcp_gpu_chunk_bytes;
  if (tcp_staging_buffers != 0) o.tcp_staging_buffers = tcp_staging_buffers;
  o.io_threads = io_threads;
  if (copy_threads > 0) o.copy_threads = copy_threads;
  if (request_timeout_ms > 0) o.request_timeout = Millis(request_timeout_ms);
  if (connect_timeout_ms > 0) o.connect_timeout = Millis(connect_timeout_ms);
  o.auth_key_file = auth_key_file;
  if (metadata_ttl_s > 0) o.metadata_ttl = std::chrono::seconds(metadata_ttl_s);
  auto engine = Take(NoGil([&] { return ferry::Engine::Create(std::move(o)); }));
  return std::make_unique<PyEngine>(std::shared_ptr<ferry::Engine>(std::move(engine)));
}

py::dict SegmentInfoDict(const ferry::SegmentInfo& info) {
  py::list buffers;
  for (const auto& b : info.buffers) {
    py::dict d;
    d["addr"] = b.addr;
    d["length"] = b.length;
    d["memfd"] = b.memfd;
    buffers.append(d);
  }
  py::dict d;
  d["name"] = info.name;
  d["epoch"] = info.epoch;
  d["same_host"] = info.same_host;
  d["buffers"] = buffers;
  return d;
}

// The C++ side of the overhead benchmark (python/bench/bench_latency.py), as
// _ferry._bench.sync_write_latency, outside the API: the same synchronous
// Transfer the Python API makes, timed in a loop with the GIL released.
// Nanoseconds per call.
// `pause_ns` spins between calls, untimed, as a Python caller's own work would.
std::vector<int64_t> BenchSyncWriteLatency(PyEngine& e, uint64_t local, uint64_t segment,
                                           uint64_t remote, uint64_t length, int iterations,
                                           int64_t pause_ns) {
  ferry::Engine& engine = e.Get();
  std::vector<int64_t> ns;
  ns.reserve(std::max(iterations, 0));
  ferry::Status st;
  {
    py::gil_scoped_release nogil;
    const ferry::Request req{ferry::Op::kWrite, Ptr(local), segment, remote, length};
    for (int i = 0; i < iterations && st.ok(); ++i) {
      const auto resume = std::chrono::steady_clock::now() + std::chrono::nanoseconds(pause_ns);
      while (std::chrono::steady_clock::now() < resume) {
      }
      auto t0 = std::chrono::steady_clock::now();
      st = engine.Transfer(req);
      ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now() - t0)
                       .count());
    }
  }
  Check(st);
  return ns;
}

}  // namespace

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "Ferry's C++ transfer engine; use the `ferry` package instead.";

  m.def("status_code_name", [](int code) {
    return std::string(ferry::StatusCodeName(static_cast<ferry::StatusCode>(code)));
  });
  // Address and size of a C-contiguous buffer; the caller keeps a view alive.
  m.def(
      "buffer_address",
      [](py::buffer b, bool writable) {
        py::buffer_info info = b.request(writable);
        if (!PyBuffer_IsContiguous(info.view(), 'C')) {
          RaiseInvalid("the buffer is not C-contiguous");
        }
        return std::make_pair(Addr(info.ptr), static_cast<uint64_t>(info.size * info.itemsize));
      },
      py::arg("buffer"), py::arg("writable"));

  py::class_<PyBatch>(m, "Batch")
      .def("__len__", [](const PyBatch& b) { return b.Get().size(); })
      // (total, succeeded, failed); never blocks.
      .def("poll",
           [](const PyBatch& b) {
             ferry::BatchStatus s = b.Get().Poll();
             return std::make_tuple(s.total, s.succeeded, s.failed);
           })
      // True when every request succeeded, False on timeout; raises the first error.
      .def(
          "wait",
          [](PyBatch& b, int64_t timeout_ms) {
            ferry::Batch& batch = b.Get();
            ferry::Status st =
                NoGil([&] { return batch.Wait(Millis(std::max<int64_t>(timeout_ms, 0))); });
            if (st.code() == ferry::StatusCode::kTimeout) {
              if (!batch.Poll().done()) return false;
              st = batch.Wait(Millis(0));  // it ended meanwhile: its own outcome
            }
            Check(st);
            return true;
          },
          py::arg("timeout_ms"))
      // (done, status code, status text, transport name) of one request.
      .def("result",
           [](const PyBatch& b, size_t i) {
             if (i >= b.Get().size()) throw py::index_error("request index out of range");
             ferry::RequestResult r = b.Get().Result(i);
             return std::make_tuple(r.done, static_cast<int>(r.status.code()), r.status.ToString(),
                                    std::string(r.transport));
           })
      .def("close", &PyBatch::Close);

  py::class_<PyEngine>(m, "Engine")
      .def(py::init(&CreateEngine), py::arg("host") = "127.0.0.1", py::arg("port") = 0,
           py::arg("metadata") = "p2p", py::arg("transport") = "", py::arg("tcp_lanes") = 0,
           py::arg("tcp_chunk_bytes") = 0, py::arg("tcp_chunks_in_flight") = 0,
           py::arg("tcp_gpu_lanes") = 0, py::arg("tcp_gpu_chunk_bytes") = 0,
           py::arg("tcp_staging_buffers") = 0, py::arg("io_threads") = 0,
           py::arg("copy_threads") = 0, py::arg("request_timeout_ms") = 0,
           py::arg("connect_timeout_ms") = 0, py::arg("auth_key_file") = "",
           py::arg("metadata_ttl_s") = 0)
      .def_property_readonly("name", [](const PyEngine& e) { return e.Get().name(); })
      .def_property_readonly("epoch", [](const PyEngine& e) { return e.Get().epoch(); })
      .def_property_readonly("auth_failures",
                             [](const PyEngine& e) { return e.Get().Stats().auth_failures; })
      .def("close", &PyEngine::Close)
      .def(
          "register_memory",
          [](PyEngine& e, uint64_t addr, uint64_t length) {
            ferry::Engine& engine = e.Get();
            Check(NoGil([&] { return engine.RegisterMemory(Ptr(addr), length); }));
          },
          py::arg("addr"), py::arg("length"))
      .def(
          "unregister_memory",
          [](PyEngine& e, uint64_t addr) {
            ferry::Engine& engine = e.Get();
            Check(NoGil([&] { return engine.UnregisterMemory(Ptr(addr)); }));
          },
          py::arg("addr"))
      .def(
          "allocate_memory",
          [](PyEngine& e, uint64_t length) {
            ferry::Engine& engine = e.Get();
            return Addr(Take(NoGil([&] { return engine.AllocateMemory(length); })));
          },
          py::arg("length"))
      .def(
          "free_memory",
          [](PyEngine& e, uint64_t addr) {
            ferry::Engine& engine = e.Get();
            Check(NoGil([&] { return engine.FreeMemory(Ptr(addr)); }));
          },
          py::arg("addr"))
      .def(
          "open_segment",
          [](PyEngine& e, const std::string& name) {
            ferry::Engine& engine = e.Get();
            return Take(NoGil([&] { return engine.OpenSegment(name); }));
          },
          py::arg("name"))
      .def(
          "segment_info",
          [](PyEngine& e, uint64_t segment) {
            ferry::Engine& engine = e.Get();
            return SegmentInfoDict(Take(NoGil([&] { return engine.GetSegmentInfo(segment); })));
          },
          py::arg("segment"))
      .def(
          "close_segment",
          [](PyEngine& e, uint64_t segment) {
            ferry::Engine& engine = e.Get();
            Check(NoGil([&] { return engine.CloseSegment(segment); }));
          },
          py::arg("segment"))
      .def(
          "transfer",
          [](PyEngine& e, int op, uint64_t local, uint64_t segment, uint64_t remote,
             uint64_t length, int64_t timeout_ms) {
            const ferry::Request req = ToRequests({{op, local, segment, remote, length}})[0];
            ferry::Engine& engine = e.Get();
            Check(NoGil([&] { return engine.Transfer(req, Millis(timeout_ms)); }));
          },
          py::arg("op"), py::arg("local"), py::arg("segment"), py::arg("remote"), py::arg("length"),
          py::arg("timeout_ms") = 0)
      .def(
          "submit",
          [](PyEngine& e, const std::vector<RequestTuple>& requests, int64_t timeout_ms,
             uint64_t stream, bool already_ready) {
            std::vector<ferry::Request> reqs = ToRequests(requests);
            ferry::SubmitOptions o;
            o.timeout = Millis(timeout_ms);
            o.stream = Ptr(stream);
            o.already_ready = already_ready;
            ferry::Engine& engine = e.Get();
            auto batch = Take(NoGil([&] { return engine.Submit(reqs, o); }));
            return std::make_unique<PyBatch>(e.Shared(), std::move(batch));
          },
          py::arg("requests"), py::arg("timeout_ms") = 0, py::arg("stream") = 0,
          py::arg("already_ready") = false)
      .def(
          "submit_on_stream",
          [](PyEngine& e, const std::vector<RequestTuple>& requests, uint64_t stream) {
            std::vector<ferry::Request> reqs = ToRequests(requests);
            ferry::Engine& engine = e.Get();
            auto batch = Take(NoGil([&] { return engine.SubmitOnStream(reqs, Ptr(stream)); }));
            return std::make_unique<PyBatch>(e.Shared(), std::move(batch));
          },
          py::arg("requests"), py::arg("stream"));

  // Benchmark-only (python/bench/bench_latency.py): not part of the API.
  py::module_ bench =
      m.def_submodule("_bench", "Benchmark hooks for python/bench; not part of ferry's API.");
  bench.def("sync_write_latency", &BenchSyncWriteLatency, py::arg("engine"), py::arg("local"),
            py::arg("segment"), py::arg("remote"), py::arg("length"), py::arg("iterations"),
            py::arg("pause_ns") = 0);

  RegisterStore(m);
}

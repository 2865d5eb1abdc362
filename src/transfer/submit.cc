#include "transfer/submit.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/event_trace.h"
#include "ferry/engine.h"
#include "gpu/copier.h"
#include "gpu/gpu.h"
#include "transfer/batch.h"
#include "transfer/peers.h"
#include "transfer/segment.h"
#include "transfer/stream_relay.h"
#include "transfer/transport.h"

namespace ferry {

namespace {
Status ForRequest(size_t i, const Status& st) {
  return Status(st.code(), "request " + std::to_string(i) + ": " + st.message());
}

// Request::expected_epoch against the descriptor held now. Read once the
// request's endpoint is in hand: that endpoint was then made from a
// descriptor of this epoch or of an older one (descriptors never go back),
// and an older one's fails on its own (tcp's Hello expects its epoch; shm
// sees its process gone), so no byte reaches a process of another epoch.
Status CheckEpoch(size_t i, const Request& r, const Segment& seg) {
  if (r.expected_epoch == 0) return Status::Ok();
  auto d = seg.descriptor();
  if (d != nullptr && d->epoch == r.expected_epoch) return Status::Ok();
  return ForRequest(i, Status::PeerRestarted(
                           fmt::format("{} has epoch {:x}, not the {:x} of the address", seg.name(),
                                       d != nullptr ? d->epoch : 0, r.expected_epoch)));
}
}  // namespace

Result<std::unique_ptr<Batch>> Submitter::Submit(std::span<const Request> reqs,
                                                 const SubmitOptions& opts) {
  FERRY_TRACE(trace::kSubmit, 0);
  Millis timeout = opts.timeout.count() > 0 ? opts.timeout : request_timeout_;
  Router::Segments segs;
  FERRY_RETURN_IF_ERROR(router_.Validate(reqs, &segs));
  auto state = std::make_shared<BatchState>(reqs.size());
  std::unordered_map<SegmentId, Status> stale_errors;
  std::set<SegmentId> refreshed;
  Deadline deadline = Deadline::After(timeout);
  state->NoteDeadline(deadline);

  // Route every request first, then plan every task, then post: a task that
  // completes early must never see its request's count unset.
  for (auto& [id, seg] : segs) {
    Status st = peers_.RefreshIfChanged(*seg);
    if (!st.ok()) stale_errors[id] = st;
  }
  struct Path {
    Status status;
    TransportSet::Route route;
  };
  std::map<std::pair<SegmentId, bool>, Path> routes;  // by segment and GPU-ness
  std::unordered_map<Endpoint*, std::vector<Task>> posts;
  std::vector<std::shared_ptr<Endpoint>> keep;
  std::shared_ptr<gpu::ReadyEvent> ready;
  // The request before's route and tasks, which the next mostly shares.
  Router::Memo memo;
  const Router::Segments::value_type* last_seg = nullptr;
  std::pair<SegmentId, bool> last_key;
  Path* last_path = nullptr;
  std::vector<Task>* last_tasks = nullptr;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& r = reqs[i];
    if (last_seg == nullptr || r.segment != last_seg->first) last_seg = &*segs.find(r.segment);
    const std::shared_ptr<Segment>& seg = last_seg->second;
    if (!stale_errors.empty()) {
      if (auto it = stale_errors.find(r.segment); it != stale_errors.end()) {
        state->FailRequest(i, it->second);
        continue;
      }
    }
    // Before the range check too, which a restarted target fails otherwise.
    if (Status st = CheckEpoch(i, r, *seg); !st.ok()) {
      state->FailRequest(i, st);
      continue;
    }
    auto remote = router_.CheckRemote(r, *seg, &refreshed, &memo);
    if (!remote.ok()) {
      state->FailRequest(i, ForRequest(i, remote.status()));
      continue;
    }
    const Router::Sides sides = router_.GpuSides(r, remote.value(), &memo);
    const int gpu_device = sides.device();
    const bool gpu_local = sides.local >= 0;
    const bool gpu = gpu_device >= 0;
    const std::pair<SegmentId, bool> key{r.segment, gpu};
    if (last_path == nullptr || key != last_key) {
      auto [rit, fresh] = routes.try_emplace(key);
      if (fresh) {
        auto got = router_.Route(seg, gpu);
        if (got.ok()) {
          rit->second.route = std::move(got).value();
        } else {
          rit->second.status = got.status();
        }
      }
      last_key = key;
      last_path = &rit->second;
      last_tasks = nullptr;
    }
    Path& rt = *last_path;
    if (!rt.status.ok()) {
      state->FailRequest(i, rt.status);
      continue;
    }
    if (Status st = CheckEpoch(i, r, *seg); !st.ok()) {
      state->FailRequest(i, st);
      continue;
    }
    if (gpu && !ready && !opts.already_ready) {
      // R1/R2: one event on the submission stream orders the whole batch.
      auto rec = copier_->RecordReady(opts.stream);
      if (!rec.ok()) return rec.status();  // nothing has been posted yet
      ready = std::move(rec).value();
    }
    const TransportCaps& caps = rt.route.transport->caps();
    const uint64_t slice =
        gpu && caps.max_gpu_task_bytes > 0 ? caps.max_gpu_task_bytes : caps.max_task_bytes;
    uint32_t n = static_cast<uint32_t>((r.length + slice - 1) / slice);
    state->Plan(i, n, caps.name);
    if (last_tasks == nullptr) {
      last_tasks = &posts[rt.route.endpoint.get()];
      if (last_tasks->empty()) {
        keep.push_back(rt.route.endpoint);
        last_tasks->reserve(reqs.size() - i);  // mostly enough: one task a request
      }
    }
    auto& v = *last_tasks;
    for (uint64_t off = 0; off < r.length; off += slice) {
      Task& t = v.emplace_back();
      t.op = r.op;
      t.local = static_cast<char*>(r.local) + off;
      t.remote = r.remote + off;
      t.length = std::min(slice, r.length - off);
      t.index = static_cast<uint32_t>(i);
      t.gpu_device = gpu_device;
      t.gpu_local = gpu_local;
      t.gpu_remote = remote.value() >= 0;
      if (gpu_device >= 0) t.ready = ready;
      t.deadline = deadline;
      t.batch = state;
    }
  }
  for (auto& ep : keep) {
    FERRY_TRACE(trace::kPost, 0);
    ep->Post(std::move(posts[ep.get()]));
  }
  return std::make_unique<Batch>(std::move(state));
}

// R5. Copies that a mapping allows (StreamPath::kMapped) go on the caller's
// stream itself, with no wait. The rest is relayed: the CPU moves the bytes,
// between a signal and a wait on the stream that only CPU progress releases,
// and GPU memory of this process is staged by copies on the stream
// (stream_relay.h). Every request is resolved before anything is enqueued (R7).
Result<std::unique_ptr<Batch>> Submitter::SubmitOnStream(std::span<const Request> reqs,
                                                         void* stream) {
  if (!copier_) {
    return Status::NotSupported("stream-ordered transfers need a GPU (" + gpu::Describe() + ")");
  }
  Router::Segments segs;
  FERRY_RETURN_IF_ERROR(router_.Validate(reqs, &segs));
  FERRY_RETURN_IF_ERROR(copier_->CheckStream(stream));
  for (auto& [id, seg] : segs) {
    FERRY_RETURN_IF_ERROR(peers_.RefreshIfChanged(*seg));
  }
  struct Copy {
    void* dst;
    const void* src;
    size_t length;
  };
  std::vector<Copy> copies;
  std::vector<std::shared_ptr<const void>> holds;  // the copies' mappings, until done
  std::vector<size_t> copied;                      // request indices
  std::vector<size_t> relayed;                     // request indices
  std::set<SegmentId> refreshed;
  std::vector<StreamRelay::Chunk> chunks;
  const Transport* in_process = router_.transports().in_process();
  auto state = std::make_shared<BatchState>(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& r = reqs[i];
    const std::shared_ptr<Segment>& seg = segs[r.segment];
    FERRY_RETURN_IF_ERROR(CheckEpoch(i, r, *seg));
    auto remote = router_.CheckRemote(r, *seg, &refreshed);
    if (!remote.ok()) return ForRequest(i, remote.status());
    const Router::Sides sides = router_.GpuSides(r, remote.value());
    auto route = router_.Route(seg, sides.device() >= 0);
    if (!route.ok()) return ForRequest(i, route.status());
    FERRY_RETURN_IF_ERROR(CheckEpoch(i, r, *seg));
    auto [transport, ep] = std::move(route).value();
    if (sides.device() >= 0) {
      Result<Endpoint::Mapped> mapped =
          transport->caps().stream_path == StreamPath::kMapped
              ? ep->MapForStream(r.remote, r.length)
              : Status::NotSupported("this transport has no stream-ordered path");
      std::string_view via = transport->caps().name;
      if (!mapped.ok() && sides.remote >= 0 && Router::InThisProcess(*seg)) {
        // GPU memory of another engine of this process: relaying would make
        // the stream's wait depend on that engine's GPU copy, which R5
        // forbids (it deadlocks under lazy loading). The address is ours:
        // copy on the caller's stream, whatever transport is forced.
        mapped = Endpoint::Mapped{reinterpret_cast<void*>(r.remote), nullptr};
        via = in_process != nullptr ? in_process->caps().name : kNoTransport;
      }
      if (mapped.ok()) {
        const bool write = r.op == Op::kWrite;
        void* remote_addr = mapped.value().addr;
        copies.push_back({write ? remote_addr : r.local, write ? r.local : remote_addr, r.length});
        if (mapped.value().hold) holds.push_back(std::move(mapped.value().hold));
        copied.push_back(i);
        state->Plan(i, 1, via);
        continue;
      }
    }
    if (!relay_) {
      return ForRequest(i, Status::NotSupported("no staging for stream-ordered transfers"));
    }
    // Relayed: a host-memory path to the target, which stages its own GPU memory.
    if (sides.remote < 0) {
      auto host = router_.Route(seg, false);
      if (!host.ok()) return ForRequest(i, host.status());
      transport = host.value().transport;
      ep = host.value().endpoint;
      FERRY_RETURN_IF_ERROR(CheckEpoch(i, r, *seg));
    } else if (!transport->caps().target_stages_gpu) {
      return ForRequest(i, Status::NotSupported(std::string("GPU memory at ") + seg->name() +
                                                " is not reachable by " + transport->caps().name +
                                                " from a stream"));
    }
    uint64_t slice = std::min<uint64_t>(transport->caps().max_task_bytes, relay_->slot_bytes());
    for (uint64_t off = 0; off < r.length; off += slice) {
      chunks.push_back({ep, r.op, static_cast<char*>(r.local) + off, sides.local >= 0,
                        r.remote + off, std::min(slice, r.length - off), static_cast<uint32_t>(i),
                        sides.remote >= 0});
    }
    relayed.push_back(i);
    state->Plan(i, 1, transport->caps().name);
  }
  state->NoteDeadline(Deadline::After(request_timeout_));
  Status failed;
  size_t enqueued = 0;
  for (const Copy& c : copies) {
    failed = copier_->EnqueueOnStream(stream, c.dst, c.src, c.length);
    if (!failed.ok()) break;
    ++enqueued;
  }
  if (enqueued > 0) {
    copier_->NotifyOnStream(stream,
                            [state, copied, enqueued, holds = std::move(holds)](const Status& st) {
                              for (size_t k = 0; k < enqueued; ++k) state->TaskDone(copied[k], st);
                            });
  }
  for (size_t k = enqueued; k < copied.size(); ++k) state->TaskDone(copied[k], failed);
  if (!chunks.empty()) {
    if (failed.ok()) {
      failed = relay_->Submit(stream, std::move(chunks), state, Deadline::After(request_timeout_));
    }
    if (!failed.ok()) {
      for (size_t i : relayed) state->TaskDone(i, failed);
    }
  }
  return std::make_unique<Batch>(std::move(state));
}

}  // namespace ferry

// The attached store's puts and gets: shared memory by reference, other
// memory through staging, and CUDA memory by IPC after the caller's stream is
// ready (store/client/attached.h).
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "gpu/gpu.h"
#include "store/client/attached.h"

namespace ferry::store::attached {
namespace {

// Classifies `parts` into `plan`; InvalidArgument for GPU memory on two
// devices, or on another device than `stream`'s.
Status PlanGpu(std::span<const Part* const> parts, void* stream, GpuPlan* plan) {
  if (gpu::DeviceCount() == 0) return Status::Ok();
  // First, before any other CUDA call: a put or get must really run now, so a
  // stream being captured into a graph is refused rather than captured.
  if (stream != nullptr) {
    FERRY_ASSIGN_OR_RETURN(bool capturing, gpu::StreamCapturing(stream));
    if (capturing) {
      return Status::NotSupported(
          "the stream is being captured into a CUDA graph; the store moves data "
          "now, so call it outside the capture");
    }
  }
  for (const Part* part : parts) {
    if (part->size == 0) continue;  // nothing to move
    const gpu::MemoryInfo info = gpu::Classify(part->data);
    if (info.kind != gpu::MemoryKind::kDevice) continue;
    if (plan->device >= 0 && info.device != plan->device) {
      return Status::InvalidArgument(
          "GPU memory on two devices in one call; one submission stream covers one");
    }
    plan->device = info.device;
    plan->gpu.insert(part->data);
    std::string handle = gpu::ExportIpc(info);
    if (handle.empty()) {
      plan->fallback = true;  // a caching or virtual-memory allocator, say
    } else {
      plan->exported[part->data] = {std::move(handle),
                                    reinterpret_cast<uint64_t>(part->data) - info.alloc_base};
    }
  }
  if (plan->device < 0 || stream == nullptr) return Status::Ok();
  FERRY_ASSIGN_OR_RETURN(int on, gpu::StreamDevice(stream));
  if (on != plan->device) {
    return Status::InvalidArgument("the stream is on GPU " + std::to_string(on) +
                                   ", the memory on GPU " + std::to_string(plan->device));
  }
  return Status::Ok();
}

// Test-only: FERRY_TEST_ATTACH_SKIP_READINESS=1 sends GPU memory without the
// readiness event, so the tests can show that their check catches stale reads.
// Read on every call, so that a benchmark can alternate with and without it.
bool SkipReadiness() {
  const char* v = std::getenv("FERRY_TEST_ATTACH_SKIP_READINESS");
  return v != nullptr && std::string_view(v) == "1";
}

// Why a value cannot go through staging, and what to do instead.
std::string TooBigForStaging(uint64_t size, uint64_t cap, const char* how) {
  return "a value of " + std::to_string(size) + " bytes exceeds the attach staging area of " +
         std::to_string(cap) + " bytes; " + how + " AllocateBuffer memory or raise attach_staging";
}

void WriteRef(ByteWriter& w, const WireRef& ref) {
  w.U8(ref.kind);
  if (ref.kind == attach::kPartGpu) {
    w.U32(static_cast<uint32_t>(ref.device));
    w.Str(ref.handle);
  } else {
    w.U32(ref.buf);
  }
  w.U64(ref.off);
  w.U64(ref.len);
}

void WriteReadiness(ByteWriter& w, const GpuPlan& plan, const std::string& event) {
  w.I32(plan.fallback ? -1 : plan.device);
  w.Str(plan.fallback ? std::string() : event);
}

}  // namespace

Status AttachedStore::Ready(const GpuPlan& plan, void* stream, std::string* event) {
  event->clear();
  if (plan.device < 0) return Status::Ok();
  auto& ev = events_[plan.device];
  if (ev == nullptr) {
    FERRY_ASSIGN_OR_RETURN(ev, gpu::IpcEvent::Create(plan.device));
  }
  if (SkipReadiness()) return ev->Record(stream);
  // A stream with nothing left to run has finished everything enqueued on it
  // before this call: the memory is ready now, with no event to record, wait
  // for or send (a GPU round trip, about 15 us at the median on the H200).
  FERRY_ASSIGN_OR_RETURN(bool idle, gpu::StreamIdle(plan.device, stream));
  if (idle) return Status::Ok();
  FERRY_RETURN_IF_ERROR(ev->Record(stream));
  // The staging fallback's copies follow the event on the stream anyway.
  if (plan.fallback || opts_.attach_readiness == AttachReadiness::kSynchronize) {
    return ev->Synchronize();
  }
  *event = ev->handle();  // the node's stream waits for it on the GPU
  return Status::Ok();
}

std::vector<Status> AttachedStore::Put(std::span<const std::string> keys,
                                       std::span<const Source> values, const PutOptions& po,
                                       bool registered) {
  std::vector<Status> out(keys.size());
  if (values.size() != keys.size()) {
    out.assign(keys.size(), Status::InvalidArgument("keys and values differ in count"));
    return out;
  }
  std::lock_guard lock(mu_);
  const uint64_t cap = staging_.mem->size();
  auto* staging = static_cast<uint8_t*>(staging_.mem->data());
  // Every item checked first, and the call's GPU memory planned: on any
  // failure there, nothing is sent.
  std::vector<const Part*> all;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::vector<Part>& parts = values[i].parts;
    out[i] = store::CheckKey(keys[i]);
    if (out[i].ok() && (parts.empty() || parts.size() > attach::kMaxParts)) {
      out[i] = Status::InvalidArgument("a value needs 1 to " + std::to_string(attach::kMaxParts) +
                                       " buffers");
    }
    for (size_t k = 0; out[i].ok() && registered && k < parts.size(); ++k) {
      if (Containing(registered_, parts[k].data, parts[k].size) == registered_.end()) {
        out[i] = NotRegistered();
      }
    }
    for (size_t k = 0; out[i].ok() && k < parts.size(); ++k) all.push_back(&parts[k]);
  }
  GpuPlan plan;
  std::string event;
  Status planned = PlanGpu(all, po.stream, &plan);
  if (planned.ok()) planned = Ready(plan, po.stream, &event);
  if (!planned.ok()) {
    for (auto& st : out) st = st.ok() ? planned : st;
    return out;
  }
  // Items of the request being built, their parts, and the staging bytes
  // they use.
  std::vector<size_t> batch;
  std::vector<std::vector<WireRef>> refs;
  uint64_t used = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    std::vector<uint8_t> p;
    ByteWriter w(&p);
    w.U32(po.replicas);
    w.U8(static_cast<uint8_t>(po.pin));
    w.U64(static_cast<uint64_t>(std::max<int64_t>(po.pin_ttl.count(), 0)));
    w.Str(po.preferred_segment);
    WriteReadiness(w, plan, event);
    w.U32(static_cast<uint32_t>(batch.size()));
    for (size_t k = 0; k < batch.size(); ++k) {
      w.Str(keys[batch[k]]);
      w.U32(static_cast<uint32_t>(refs[k].size()));
      for (const WireRef& ref : refs[k]) WriteRef(w, ref);
    }
    auto f = Call(Type::kPut, p);
    ByteReader r(f.ok() ? f.value().payload.data() : nullptr,
                 f.ok() ? f.value().payload.size() : 0);
    const bool counted = f.ok() && r.U32() == batch.size();
    for (size_t i : batch) out[i] = !f.ok() ? f.status() : counted ? ReadStatus(r) : Status();
    if (f.ok() && (!counted || !r.ok())) {
      Status bad = Drop(Status::ProtocolError("malformed Put reply from the node"));
      for (size_t i : batch) out[i] = bad;
    }
    batch.clear();
    refs.clear();
    used = 0;
  };
  auto shared = [&](const Part& part) {
    auto range = Containing(registered_, part.data, part.size);
    return range != registered_.end() && range->second.mem != nullptr ? range : registered_.end();
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!out[i].ok()) continue;
    const std::vector<Part>& parts = values[i].parts;
    // Parts in shared memory, and exported GPU memory, go by reference; the
    // others through staging.
    uint64_t staged = 0;
    for (const Part& part : parts) {
      const bool by_ref =
          plan.exported.count(part.data) ? !plan.fallback : shared(part) != registered_.end();
      if (!by_ref) staged += part.size;
    }
    if (staged > cap) {
      out[i] = Status::InvalidArgument(TooBigForStaging(staged, cap, "put it from"));
      continue;
    }
    if (cap - used < staged) flush();
    std::vector<WireRef> item;
    for (const Part& part : parts) {
      if (auto e = plan.exported.find(part.data); e != plan.exported.end() && !plan.fallback) {
        item.push_back(
            {attach::kPartGpu, 0, plan.device, e->second.first, e->second.second, part.size});
        continue;
      }
      if (auto range = shared(part); range != registered_.end()) {
        item.push_back({attach::kPartBuffer,
                        range->second.id,
                        -1,
                        {},
                        reinterpret_cast<uint64_t>(part.data) - range->first,
                        part.size});
        continue;
      }
      if (plan.gpu.count(part.data)) {
        out[i] = gpu::CopyOnStreamAndWait(staging + used, part.data, part.size, po.stream);
      } else if (part.size > 0) {
        std::memcpy(staging + used, part.data, part.size);
      }
      item.push_back({attach::kPartBuffer, staging_.id, -1, {}, used, part.size});
      used += part.size;
    }
    if (!out[i].ok()) continue;
    refs.push_back(std::move(item));
    batch.push_back(i);
    if (batch.size() == attach::kMaxItems) flush();
  }
  flush();
  return out;
}

std::vector<Result<size_t>> AttachedStore::Get(std::span<const std::string> keys,
                                               std::span<Sink> sinks, bool registered,
                                               const GetOptions& options) {
  std::vector<Status> st(keys.size());
  std::vector<size_t> sizes(keys.size(), 0);
  std::lock_guard lock(mu_);
  const uint64_t cap = staging_.mem->size();
  const auto* staging = static_cast<const uint8_t*>(staging_.mem->data());
  std::vector<const Part*> all;
  for (size_t i = 0; i < keys.size(); ++i) {
    st[i] = store::CheckKey(keys[i]);
    if (st[i].ok() && sinks[i].parts.size() > attach::kMaxParts) {
      st[i] = Status::InvalidArgument("at most " + std::to_string(attach::kMaxParts) +
                                      " buffers per value");
    }
    for (size_t k = 0; st[i].ok() && registered && k < sinks[i].parts.size(); ++k) {
      const Part& part = sinks[i].parts[k];
      if (Containing(registered_, part.data, part.size) == registered_.end()) {
        st[i] = NotRegistered();
      }
    }
    for (size_t k = 0; st[i].ok() && k < sinks[i].parts.size(); ++k) {
      all.push_back(&sinks[i].parts[k]);
    }
  }
  if (options.expect_prefix.size() > attach::kMaxMessage) {
    std::vector<Result<size_t>> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      out.push_back(Status::InvalidArgument("at most 4096 expected bytes"));
    }
    return out;
  }
  GpuPlan plan;
  std::string event;
  // The node writes GPU memory after the consumer stream's earlier work (R2).
  Status planned = PlanGpu(all, options.stream, &plan);
  if (planned.ok()) planned = Ready(plan, options.stream, &event);
  // Per item: its parts by reference (shared or exported GPU memory), or
  // none: packed into staging and copied out here.
  std::vector<std::vector<WireRef>> direct(keys.size());
  std::vector<size_t> pending;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st[i].ok() && !planned.ok()) st[i] = planned;
    if (!st[i].ok()) continue;
    bool by_ref = sinks[i].vec == nullptr;
    for (size_t k = 0; by_ref && k < sinks[i].parts.size(); ++k) {
      const Part& part = sinks[i].parts[k];
      auto range = Containing(registered_, part.data, part.size);
      if (auto e = plan.exported.find(part.data); e != plan.exported.end() && !plan.fallback) {
        direct[i].push_back(
            {attach::kPartGpu, 0, plan.device, e->second.first, e->second.second, part.size});
      } else if (range != registered_.end() && range->second.mem != nullptr) {
        direct[i].push_back({attach::kPartBuffer,
                             range->second.id,
                             -1,
                             {},
                             reinterpret_cast<uint64_t>(part.data) - range->first,
                             part.size});
      } else {
        by_ref = false;
      }
    }
    if (!by_ref || direct[i].empty()) direct[i].clear();
    pending.push_back(i);
  }
  // Rounds: packed values that found no room left in staging go again, first.
  while (!pending.empty()) {
    const size_t n = std::min<size_t>(attach::kMaxItems, pending.size());
    std::vector<size_t> batch(pending.begin(), pending.begin() + n);
    std::vector<size_t> later(pending.begin() + n, pending.end());
    std::vector<uint8_t> p;
    ByteWriter w(&p);
    w.U32(staging_.id);
    w.U64(0);
    w.U64(cap);
    WriteReadiness(w, plan, event);
    w.Str(options.expect_prefix);
    w.U32(static_cast<uint32_t>(n));
    for (size_t i : batch) {
      w.Str(keys[i]);
      w.U32(static_cast<uint32_t>(direct[i].size()));  // 0: packed
      for (const WireRef& ref : direct[i]) WriteRef(w, ref);
    }
    auto f = Call(Type::kGet, p);
    if (!f.ok()) {
      for (size_t i : batch) st[i] = f.status();
      pending = std::move(later);
      continue;
    }
    ByteReader r(f.value().payload.data(), f.value().payload.size());
    const bool counted = r.U32() == n;
    std::vector<size_t> retry;
    bool placed_any = false;  // whether some packed value took staging room
    std::vector<std::tuple<size_t, Status, uint64_t, uint64_t>> got;
    for (size_t k = 0; counted && k < n; ++k) {
      Status s = ReadStatus(r);
      const uint64_t size = r.U64(), off = r.U64();
      got.emplace_back(batch[k], std::move(s), size, off);
      if (std::get<1>(got.back()).ok() && direct[batch[k]].empty()) placed_any = true;
    }
    if (!counted || !r.ok() || r.Left() != 0) {
      Status bad = Drop(Status::ProtocolError("malformed Get reply from the node"));
      for (size_t i : batch) st[i] = bad;
      pending = std::move(later);
      continue;
    }
    for (auto& [i, s, size, off] : got) {
      sizes[i] = size;
      const bool packed = direct[i].empty();
      if (!packed || (!s.ok() && s.code() != StatusCode::kOutOfRange)) {
        st[i] = s;
        continue;
      }
      if (s.code() == StatusCode::kOutOfRange) {
        if (size > cap) {
          st[i] = Status::OutOfRange(TooBigForStaging(size, cap, "get it into"));
        } else if (placed_any) {
          retry.push_back(i);
        } else {
          st[i] = s;
        }
        continue;
      }
      if (off > cap || size > cap - off) {
        st[i] = Drop(Status::ProtocolError("the node placed a value outside staging"));
        continue;
      }
      Sink& sink = sinks[i];
      if (sink.vec != nullptr) {
        try {
          sink.vec->assign(staging + off, staging + off + size);
        } catch (const std::bad_alloc&) {
          st[i] = Status::ResourceExhausted("cannot allocate " + std::to_string(size) +
                                            " bytes for the value");
        }
      } else if (const size_t room = store::TotalSize(sink.parts); room < size) {
        st[i] = Status::OutOfRange("buffer of " + std::to_string(room) + " bytes; the value has " +
                                   std::to_string(size));
      } else {
        // The parts in order, as the value's bytes; GPU ones on the stream.
        uint64_t done = 0;
        for (const Part& part : sink.parts) {
          const uint64_t len = std::min<uint64_t>(part.size, size - done);
          if (len > 0 && plan.gpu.count(part.data)) {
            Status c =
                gpu::CopyOnStreamAndWait(part.data, staging + off + done, len, options.stream);
            if (!c.ok()) st[i] = c;
          } else if (len > 0) {
            std::memcpy(part.data, staging + off + done, len);
          }
          done += len;
        }
      }
    }
    retry.insert(retry.end(), later.begin(), later.end());
    pending = std::move(retry);
  }
  std::vector<Result<size_t>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out.push_back(st[i].ok() ? Result<size_t>(sizes[i]) : Result<size_t>(st[i]));
  }
  return out;
}

}  // namespace ferry::store::attached

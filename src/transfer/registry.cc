#include "transfer/registry.h"

#include <algorithm>

#include "common/log.h"
#include "transfer/segment.h"

namespace ferry {

namespace {
std::vector<TransportRegistration>& Registry() {
  static std::vector<TransportRegistration> r;
  return r;
}

// What may be forced: a transport that moves host memory to other processes.
bool Forceable(const Transport& t) {
  const TransportCaps& c = t.caps();
  return c.available && c.host_memory && c.reach != Reach::kProcess;
}
}  // namespace

bool RegisterTransport(const char* name, TransportFactory factory) {
  Registry().push_back({name, factory});
  return true;
}

std::vector<TransportRegistration> RegisteredTransports() { return Registry(); }

Result<std::unique_ptr<TransportSet>> TransportSet::Create(EngineContext& ctx, std::string forced) {
  std::unique_ptr<TransportSet> set(new TransportSet());
  for (const auto& reg : RegisteredTransports()) {
    auto t = reg.factory(ctx);
    if (std::string_view(t->caps().name) != reg.name) {
      return Status::Internal(std::string("transport registered as ") + reg.name +
                              " calls itself " + t->caps().name);
    }
    FERRY_RETURN_IF_ERROR(t->CheckOptions());
    set->all_.push_back(std::move(t));
  }
  std::stable_sort(set->all_.begin(), set->all_.end(), [](const auto& a, const auto& b) {
    return a->caps().priority < b->caps().priority;
  });
  std::string choices;
  for (const auto& t : set->all_) {
    if (!Forceable(*t)) continue;
    if (t->caps().name == forced) set->forced_ = t.get();
    choices += std::string(t->caps().name) + ", ";
  }
  if (!forced.empty() && set->forced_ == nullptr) {
    return Status::InvalidArgument("transport must be one of " + choices + "or empty, not '" +
                                   forced + "'");
  }
  const bool alone = set->forced_ != nullptr && set->forced_->caps().reach == Reach::kNetwork;
  for (const auto& t : set->all_) {
    const TransportCaps& c = t->caps();
    if (c.available && c.reach == Reach::kProcess && set->in_process_ == nullptr) {
      set->in_process_ = t.get();
    }
    if (!c.available || c.reach == Reach::kProcess || (alone && t.get() != set->forced_)) continue;
    set->offered_.push_back(t.get());
    set->offered_names_.push_back(c.name);
  }
  return set;
}

Status TransportSet::OfferAll() {
  for (Transport* t : offered_) FERRY_RETURN_IF_ERROR(t->Offer());
  return Status::Ok();
}

std::vector<std::string> TransportSet::DescribeSegment() const {
  std::vector<std::string> blobs;
  blobs.reserve(offered_.size());
  for (Transport* t : offered_) {
    std::string b = t->DescribeSegment();
    if (b.size() > kMaxSegmentBlob) {
      FERRY_LOG_ERROR("{}: its segment blob of {} bytes is over the limit; not offered",
                      t->caps().name, b.size());
      b.clear();
    }
    blobs.push_back(std::move(b));
  }
  return blobs;
}

std::vector<std::string> TransportSet::DescribeMemory(const Region& region,
                                                      const gpu::MemoryInfo& info) const {
  std::vector<std::string> blobs;
  blobs.reserve(offered_.size());
  for (Transport* t : offered_) {
    std::string b = t->DescribeMemory(region, info);
    if (b.size() > kMaxRegionBlob) {
      FERRY_LOG_ERROR("{}: a region's blob of {} bytes is over the limit; not offered",
                      t->caps().name, b.size());
      b.clear();
    }
    blobs.push_back(std::move(b));
  }
  return blobs;
}

// A forced transport applies to remote segments and to our own, so tests and
// benchmarks can push loopback traffic through it. It forces the host-memory
// path, and the GPU path too when it moves GPU memory itself; otherwise the
// transports that move GPU memory alone stay allowed.
bool TransportSet::Allowed(const Transport& t) const {
  if (forced_ == nullptr || &t == forced_) return true;
  const TransportCaps& c = t.caps();
  return c.gpu_memory && !c.host_memory && !forced_->caps().gpu_memory;
}

Result<TransportSet::Route> TransportSet::RouteTo(const std::shared_ptr<Segment>& seg,
                                                  bool gpu) const {
  for (const auto& t : all_) {
    const TransportCaps& c = t->caps();
    if (!c.available || !(gpu ? c.gpu_memory : c.host_memory)) continue;
    if (!Allowed(*t) || !t->CanReach(*seg)) continue;
    Transport* tp = t.get();
    auto ep = seg->EndpointFor(tp, [&] { return tp->Connect(seg); });
    if (!ep.ok()) return ep.status();
    return Route{tp, std::move(ep).value()};
  }
  const std::string how = forced_ == nullptr ? "" : std::string(" with ") + forced_->caps().name;
  if (gpu) {
    return Status::NotSupported("no transport moves GPU memory to segment " + seg->name() + how +
                                " yet");
  }
  return Status::Unavailable("no transport can reach segment " + seg->name() + how);
}

void TransportSet::StopAll() {
  for (const auto& t : all_) t->Stop();
}

Status TransportSet::ConfineHelpers(const std::vector<int>& cpus) {
  for (const auto& t : all_) FERRY_RETURN_IF_ERROR(t->ConfineHelpers(cpus));
  return Status::Ok();
}

int TransportSet::io_threads() const {
  int n = 1;
  for (const auto& t : all_) {
    if (t->caps().available) n = std::max(n, t->caps().io_threads);
  }
  return n;
}

std::vector<FrameService*> TransportSet::frame_services() const {
  std::vector<FrameService*> out;
  for (const auto& t : all_) {
    if (!t->caps().available) continue;
    if (FrameService* f = t->frame_service()) out.push_back(f);
  }
  return out;
}

}  // namespace ferry

#include "store/node/node.h"

#include "common/log.h"
#include "common/prefault.h"
#include "coord/etcd_url.h"
#include "store/rpc/leader.h"

namespace ferry::store {

StoreNode::StoreNode(Engine& engine, NodeOptions options, std::unique_ptr<MasterClient> client)
    : engine_(engine),
      options_(std::move(options)),
      client_(std::move(client)),
      catalog_([this](uint64_t addr, uint64_t length) { return Owns(addr, length); }),
      ticker_(std::make_unique<Ticker>("ferry-heartbeat", options_.heartbeat,
                                       [this](bool) { Tick(); })) {}

Result<std::unique_ptr<StoreNode>> StoreNode::Start(Engine& engine, const NodeOptions& options,
                                                    bool wait_for_mount) {
  if (options.segments < 1 || options.segments > 64 || options.segment_size < 4096) {
    return Status::InvalidArgument("a node needs 1 to 64 segments of at least 4 KiB");
  }
  if (options.heartbeat.count() <= 0) {
    return Status::InvalidArgument("heartbeat period must be positive");
  }
  FERRY_ASSIGN_OR_RETURN(auto client,
                         MasterClient::Connect(options.master, options.rpc_timeout, options.key));
  std::unique_ptr<StoreNode> node(new StoreNode(engine, options, std::move(client)));
  for (int i = 0; i < options.segments; ++i) {
    FERRY_ASSIGN_OR_RETURN(void* p, engine.AllocateMemory(options.segment_size));
    // Fault the pages in now, not on the first put that lands there.
    Prefault(p, options.segment_size);
    node->regions_.emplace_back(reinterpret_cast<uint64_t>(p), options.segment_size);
  }
  if (coord::IsEtcdUrl(options.master)) {
    FERRY_ASSIGN_OR_RETURN(node->roster_, RosterEntry::Join(options.master, engine.name()));
  }
  Status first = node->MountOnce();
  if (!first.ok()) {
    if (wait_for_mount || first.code() == StatusCode::kUnauthenticated) return first;
    FERRY_LOG_WARN("node {}: first mount failed, retrying: {}", engine.name(), first.ToString());
  }
  node->ticker_->Start();
  return node;
}

StoreNode::~StoreNode() {
  ticker_->Stop();  // its job reaches it through ticker_
  ticker_.reset();
  if (mounted_) (void)client_->Unmount(engine_.name());
  for (auto [addr, size] : regions_) (void)engine_.FreeMemory(reinterpret_cast<void*>(addr));
}

bool StoreNode::Owns(uint64_t addr, uint64_t length) const {
  for (auto [base, size] : regions_) {
    if (addr >= base && length <= size && addr - base <= size - length) return true;
  }
  return false;
}

Status StoreNode::MountOnce() {
  if (size_t stale = catalog_.Verify(); stale > 0) {
    FERRY_LOG_WARN("node {}: {} cataloged objects' bytes changed since; not reported",
                   engine_.name(), stale);
  }
  NodeMount m{engine_.name(), engine_.epoch(), regions_, catalog_.Entries(), mounted_before_};
  FERRY_ASSIGN_OR_RETURN(MountReply reply, client_->Mount(m));
  // The master numbers its changes for this mount from 1; the entries it
  // did not take come back as forgets.
  catalog_.Restart();
  mounted_before_ = true;
  // A third of the master's TTL at most; the ticker runs from Start on.
  period_ = std::max(Millis(5), std::min(options_.heartbeat, reply.node_ttl / 3));
  ticker_->SetPeriod(period_);
  catalog_sync_ = reply.catalog_sync;
  mounted_ = true;
  FERRY_LOG_INFO("node {}: mounted {} regions at {} (term {}); {} of {} cataloged objects taken",
                 engine_.name(), regions_.size(), client_->address(), reply.term, reply.recovered,
                 m.catalog.size());
  return Status::Ok();
}

// Heartbeats, applying the catalog changes they bring, and mounts again when
// the master has forgotten this node.
void StoreNode::Tick() {
  if (mounted_) {
    const auto start = Clock::now();
    const Millis hold = catalog_sync_ ? period_ : Millis(0);
    auto changes = client_->Heartbeat(engine_.name(), catalog_.acked(), false, hold);
    if (changes.status().code() == StatusCode::kNotFound) {
      FERRY_LOG_WARN("node {}: the master forgot this node; mounting again", engine_.name());
      mounted_ = false;
    } else if (changes.ok()) {
      // A batch is acknowledged at once, not at the next heartbeat, so the
      // master's queue for this node (ferry_store_catalog_pending) empties
      // and, in sync mode, the commits waiting on it return.
      const bool some = !changes.value().empty();
      bool applied = true;
      if (some) {
        Status st = catalog_.Apply(changes.value());
        applied = st.ok();
        if (!st.ok()) {
          FERRY_LOG_WARN("node {}: catalog: {}", engine_.name(), st.ToString());
        } else if (!catalog_sync_) {
          changes = client_->Heartbeat(engine_.name(), catalog_.acked(), /*ack_only=*/true);
        }
      }
      // The next call acknowledges and waits again. A call answered early
      // with nothing (a master stopping) waits the period out instead.
      if (catalog_sync_ && applied && (some || Clock::now() - start >= hold / 2)) {
        ticker_->Wake();
      }
    }
    if (!changes.ok() && changes.status().code() != StatusCode::kNotFound) {
      FERRY_LOG_DEBUG("node {}: heartbeat: {}", engine_.name(), changes.status().ToString());
    }
  }
  if (!mounted_) {
    Status st = MountOnce();
    if (!st.ok()) FERRY_LOG_DEBUG("node {}: mount: {}", engine_.name(), st.ToString());
  }
}

}  // namespace ferry::store

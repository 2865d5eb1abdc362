// The tcp transport: reaches any peer whose listener it can connect to. Each
// request is sliced into chunks (tcp_chunk_bytes) spread round-robin over the
// peer's lanes (tcp_lanes), each lane keeping tcp_chunks_in_flight on the wire.
#include <atomic>

#include "transfer/segment.h"
#include "transfer/tcp/lane.h"
#include "transfer/transport.h"

namespace ferry {
namespace {

class TcpEndpoint : public Endpoint {
 public:
  explicit TcpEndpoint(std::vector<std::shared_ptr<Lane>> lanes) : lanes_(std::move(lanes)) {}
  ~TcpEndpoint() override { Close(); }

  void Post(std::vector<Task> tasks) override {
    const size_t n = lanes_.size();
    if (tasks.size() == 1) {
      lanes_[next_.fetch_add(1, std::memory_order_relaxed) % n]->Post(std::move(tasks));
      return;
    }
    std::vector<std::vector<Task>> per(n);
    size_t start = next_.fetch_add(tasks.size(), std::memory_order_relaxed);
    for (size_t i = 0; i < tasks.size(); ++i) per[(start + i) % n].push_back(std::move(tasks[i]));
    for (size_t i = 0; i < n; ++i) {
      if (!per[i].empty()) lanes_[i]->Post(std::move(per[i]));
    }
  }

  void Close() override {
    for (auto& l : lanes_) l->Close();
  }

 private:
  std::vector<std::shared_ptr<Lane>> lanes_;
  std::atomic<size_t> next_{0};
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(EngineContext& ctx) : ctx_(ctx) {
    caps_.kind = TransportKind::kTcp;
    caps_.name = "tcp";
    caps_.priority = 30;
    caps_.max_task_bytes = ctx.options.tcp_chunk_bytes;
  }

  const TransportCaps& caps() const override { return caps_; }

  bool CanReach(const Segment& segment) const override {
    auto d = segment.descriptor();
    return d && d->Offers("tcp");
  }

  Result<std::shared_ptr<Endpoint>> Connect(const std::shared_ptr<Segment>& segment) override {
    asio::error_code ec;
    auto addr = asio::ip::make_address(segment->host(), ec);
    if (ec) return Status(StatusCode::kInvalidArgument, "bad peer address " + segment->host());
    Lane::Config cfg;
    cfg.peer = asio::ip::tcp::endpoint(addr, segment->port());
    cfg.peer_name = segment->name();
    cfg.epoch = segment->descriptor()->epoch;
    cfg.max_in_flight = ctx_.options.tcp_chunks_in_flight;
    cfg.connect_timeout = ctx_.options.connect_timeout;
    cfg.progress_timeout = ctx_.options.request_timeout;
    std::vector<std::shared_ptr<Lane>> lanes;
    for (int i = 0; i < ctx_.options.tcp_lanes; ++i) {
      lanes.push_back(std::make_shared<Lane>(ctx_.io, cfg, segment));
    }
    return std::shared_ptr<Endpoint>(std::make_shared<TcpEndpoint>(std::move(lanes)));
  }

 private:
  EngineContext& ctx_;
  TransportCaps caps_;
};

}  // namespace

FERRY_REGISTER_TRANSPORT(tcp, TcpTransport);

}  // namespace ferry

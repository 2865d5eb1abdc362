// gRPC or the JSON gateway for etcd? Times both against one etcd: the median
// (and p99) of N sequential Puts, and of a watch notification (from issuing a
// Put to the watcher's callback), through coord/'s gRPC client and through
// the gateway (/v3/kv/put, a streaming /v3/watch) over cpp-httplib with a
// kept-alive connection. docs/cluster.md has the figures and the choice.
//
//   api_latency HOST:PORT [N]      (prints one JSON object)
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "coord/etcd_client.h"
#include "coord/etcd_watch.h"

namespace {

using ferry::Clock;

std::string Base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += t[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += t[(v >> 18) & 63];
    out += t[(v >> 12) & 63];
    out += i + 1 < in.size() ? t[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

nlohmann::json Summary(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {{"n", us.size()},
          {"median_us", us[us.size() / 2]},
          {"p99_us", us[std::min(us.size() - 1, us.size() * 99 / 100)]}};
}

// Waits for `count` to reach `want`, up to 5 s; false on timeout.
bool Await(std::mutex& mu, std::condition_variable& cv, const int& count, int want) {
  std::unique_lock lk(mu);
  return cv.wait_for(lk, std::chrono::seconds(5), [&] { return count >= want; });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s HOST:PORT [N]\n", argv[0]);
    return 2;
  }
  const std::string ep = argv[1];
  const int n = argc > 2 ? std::atoi(argv[2]) : 1000;
  const int watches = std::max(1, n / 5);
  const std::string value(64, 'v');
  nlohmann::json out = {{"endpoint", ep}, {"value_bytes", value.size()}};

  // gRPC.
  auto client = ferry::coord::EtcdClient::Create({{ep}, ferry::Millis(3000)});
  if (!client.ok()) return 1;
  auto& c = *client.value();
  std::vector<double> us;
  for (int i = 0; i < n + 50; ++i) {  // the first 50 warm up
    auto t0 = Clock::now();
    if (!c.Put("/bench/grpc/" + std::to_string(i % 100), value).ok()) return 1;
    if (i >= 50) us.push_back(Micros(Clock::now() - t0));
  }
  out["grpc_put"] = Summary(us);
  {
    std::mutex mu;
    std::condition_variable cv;
    int seen = 0;
    auto w = ferry::coord::EtcdWatch::Start(client.value(), "/bench/grpc-watch", false, 0,
                                            [&](const ferry::coord::WatchUpdate& up) {
                                              std::lock_guard lk(mu);
                                              seen += static_cast<int>(up.events.size());
                                              cv.notify_all();
                                            });
    if (!w.ok()) return 1;
    us.clear();
    for (int i = 0; i < watches; ++i) {
      auto t0 = Clock::now();
      if (!c.Put("/bench/grpc-watch", value).ok() || !Await(mu, cv, seen, i + 1)) return 1;
      us.push_back(Micros(Clock::now() - t0));
    }
    out["grpc_watch"] = Summary(us);
  }

  // The JSON gateway: keys and values in base64, as it wants them.
  const std::string host = ep.substr(0, ep.rfind(':'));
  const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
  httplib::Client http(host, port);
  http.set_keep_alive(true);
  // Without it each request waits ~40 ms: headers and body go out in two
  // writes, and Nagle holds the second until etcd's delayed ACK.
  http.set_tcp_nodelay(true);
  us.clear();
  for (int i = 0; i < n + 50; ++i) {
    nlohmann::json body = {{"key", Base64("/bench/http/" + std::to_string(i % 100))},
                           {"value", Base64(value)}};
    auto t0 = Clock::now();
    auto r = http.Post("/v3/kv/put", body.dump(), "application/json");
    if (!r || r->status != 200) return 1;
    auto reply = nlohmann::json::parse(r->body, nullptr, false);  // what a client must do
    if (reply.is_discarded() || !reply.contains("header")) return 1;
    if (i >= 50) us.push_back(Micros(Clock::now() - t0));
  }
  out["gateway_put"] = Summary(us);
  {
    std::mutex mu;
    std::condition_variable cv;
    int seen = 0;
    std::atomic<bool> stop{false};
    std::string buf;
    httplib::Client stream(host, port);
    stream.set_read_timeout(std::chrono::seconds(10));
    stream.set_tcp_nodelay(true);
    std::thread reader([&] {
      httplib::Request req;
      req.method = "POST";
      req.path = "/v3/watch";
      req.body = nlohmann::json{{"create_request", {{"key", Base64("/bench/http-watch")}}}}.dump();
      req.set_header("Content-Type", "application/json");
      req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
        buf.append(data, len);
        size_t nl;
        while ((nl = buf.find('\n')) != std::string::npos) {
          auto msg = nlohmann::json::parse(buf.substr(0, nl), nullptr, false);
          buf.erase(0, nl + 1);
          if (!msg.is_discarded() && msg.contains("result") && msg["result"].contains("events")) {
            std::lock_guard lk(mu);
            seen += static_cast<int>(msg["result"]["events"].size());
            cv.notify_all();
          }
        }
        return !stop.load();
      };
      (void)stream.send(req);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the watch is created
    us.clear();
    for (int i = 0; i < watches; ++i) {
      nlohmann::json body = {{"key", Base64("/bench/http-watch")}, {"value", Base64(value)}};
      auto t0 = Clock::now();
      auto r = http.Post("/v3/kv/put", body.dump(), "application/json");
      if (!r || r->status != 200 || !Await(mu, cv, seen, i + 1)) {
        std::fprintf(stderr, "gateway watch: no event\n");
        stop = true;
        stream.stop();
        reader.join();
        return 1;
      }
      us.push_back(Micros(Clock::now() - t0));
    }
    out["gateway_watch"] = Summary(us);
    stop = true;
    nlohmann::json body = {{"key", Base64("/bench/http-watch")}, {"value", Base64(value)}};
    (void)http.Post("/v3/kv/put", body.dump(), "application/json");  // wakes the reader
    stream.stop();
    reader.join();
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

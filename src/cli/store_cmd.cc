// `ferry store`: a shell client of the store, in the spirit of redis-cli.
// Exit codes: 0 done, 1 the store said no (or `exists` found nothing), 2 bad
// usage.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/bench_util.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "ferry/store.h"

namespace ferry::cli {
namespace {

int Fail(const Status& st) {
  std::fprintf(stderr, "ferry store: %s\n", st.ToString().c_str());
  return 1;
}

Result<std::vector<uint8_t>> ReadInput(const std::string& file) {
  std::vector<uint8_t> data;
  if (file == "-") {
    data.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    return data;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::IoError("cannot read " + file);
  data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::IoError("cannot read " + file);
  return data;
}

Status WriteOutput(const std::string& file, const std::vector<uint8_t>& data) {
  if (file.empty() || file == "-") {
    std::fwrite(data.data(), 1, data.size(), stdout);
    return std::fflush(stdout) == 0 ? Status::Ok() : Status::IoError("stdout");
  }
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  out.close();
  return out ? Status::Ok() : Status::IoError("cannot write " + file);
}

}  // namespace

// A pure client of --master, or attached to --socket.
Result<std::unique_ptr<Store>> Open(const StoreArgs& a) {
  if (a.master.empty() == a.socket.empty()) {
    return Status::InvalidArgument("give one of --master HOST:PORT or --socket PATH");
  }
  StoreOptions o;
  o.rpc_timeout = std::chrono::milliseconds(a.timeout_ms);
  o.master = a.master;
  o.local_memory = 0;  // a pure client: it contributes nothing
  o.auth_key_file = a.auth_key_file;
  return a.socket.empty() ? Store::Create(o) : Store::Attach(a.socket, o);
}

int StoreCommand(const StoreArgs& a) {
  auto opened = Open(a);
  if (!opened.ok()) return Fail(opened.status());
  Store& s = *opened.value();
  if (a.command == "put") {
    auto data = ReadInput(a.file);
    if (!data.ok()) return Fail(data.status());
    Status st = s.Put(a.key, data.value());
    return st.ok() ? 0 : Fail(st);
  }
  if (a.command == "get") {
    auto v = s.Get(a.key);
    if (!v.ok()) return Fail(v.status());
    Status st = WriteOutput(a.file, v.value());
    return st.ok() ? 0 : Fail(st);
  }
  if (a.command == "exists") {
    Status st = s.Exists(a.key);
    if (st.code() == StatusCode::kNotFound) {
      std::printf("false\n");
      return 1;
    }
    if (!st.ok()) return Fail(st);
    std::printf("true\n");
    return 0;
  }
  if (a.command == "rm") {
    Status st = s.Remove(a.key, a.force);
    return st.ok() ? 0 : Fail(st);
  }
  auto stats = s.Stats();
  if (!stats.ok()) return Fail(stats.status());
  const StoreStats& x = stats.value();
  nlohmann::json j = {{"capacity", x.capacity},
                      {"used", x.used},
                      {"nodes", x.nodes},
                      {"objects", x.objects},
                      {"term", x.term},
                      {"recovered", x.recovered},
                      {"recovered_total", x.recovered_total},
                      {"master", s.master_address()}};
  if (!x.leader.empty()) j["leader"] = x.leader;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// `ferry bench store-latency`: the C++ side of python/bench/bench_store_latency.py.
// Puts one value, then times GetInto of it into AllocateBuffer memory, one
// call at a time; prints the median and p99 in microseconds as JSON.
int BenchStoreLatency(const StoreArgs& a, uint64_t size, int iterations) {
  auto opened = Open(a);
  if (!opened.ok()) return Fail(opened.status());
  Store& s = *opened.value();
  auto mem = s.AllocateBuffer(size);
  if (!mem.ok()) return Fail(mem.status());
  std::memset(mem.value()->data(), 0x5a, size);
  const StoreBuffer buf{mem.value()->data(), size};
  const std::string key = "latency/" + std::to_string(getpid());
  if (Status st = s.PutFrom(key, buf); !st.ok()) return Fail(st);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    auto r = s.GetInto(key, buf);
    us.push_back(SecondsSince(t0) * 1e6);
    if (!r.ok()) return Fail(r.status());
  }
  (void)s.Remove(key, true);
  nlohmann::json j = {{"size", size},
                      {"iterations", iterations},
                      {"attached", !a.socket.empty()},
                      {"p50_us", Percentile(us, 0.5)},
                      {"p99_us", Percentile(us, 0.99)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace ferry::cli

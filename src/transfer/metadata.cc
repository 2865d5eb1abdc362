#include "transfer/metadata.h"

#include <asio.hpp>
#include <charconv>

#include "transfer/frame_wire.h"
#include "transfer/handshake.h"

namespace ferry {

Result<SegmentAddress> ParseSegmentName(std::string_view name) {
  auto bad = [&] {
    return Status::InvalidArgument("segment name '" + std::string(name) + "' is not host:port");
  };
  size_t colon = name.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == name.size()) return bad();
  std::string_view host = name.substr(0, colon);
  std::string_view port_s = name.substr(colon + 1);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_s.data(), port_s.data() + port_s.size(), port);
  if (ec != std::errc() || ptr != port_s.data() + port_s.size() || port == 0 || port > 65535) {
    return bad();
  }
  asio::error_code aec;
  asio::ip::make_address(std::string(host), aec);
  if (aec) {
    return Status::InvalidArgument("segment host '" + std::string(host) + "' is not an IP address");
  }
  return SegmentAddress{std::string(host), static_cast<uint16_t>(port)};
}

Result<SegmentDescriptor> FetchDescriptor(const SegmentAddress& addr, Millis timeout,
                                          std::shared_ptr<const auth::Key> key) {
  using asio::ip::tcp;
  asio::io_context io;
  tcp::socket sock(io);
  const std::string who = addr.host + ":" + std::to_string(addr.port);
  Status result = Status::Timeout("no descriptor from " + who + " within " +
                                  std::to_string(timeout.count()) + " ms");
  SegmentDescriptor desc;
  uint8_t out[wire::kHeaderSize];
  uint8_t in[wire::kHeaderSize];
  std::vector<uint8_t> payload;
  wire::EncodeHeader({wire::Opcode::kGetDescriptor, StatusCode::kOk, 1, 0, 0}, out);

  auto ask = [&] {
    asio::async_write(sock, asio::buffer(out), [&](asio::error_code ec, size_t) {
      if (ec) {
        result = Status::ConnectionLost(who + ": " + ec.message());
        return;
      }
      asio::async_read(sock, asio::buffer(in), [&](asio::error_code ec, size_t) {
        if (ec) {
          result = Status::ConnectionLost(who + " closed: " + ec.message());
          return;
        }
        auto h = wire::DecodeHeader(in);
        if (!h.ok()) {
          result = h.status();
          return;
        }
        if (h.value().opcode == wire::Opcode::kDescriptor &&
            h.value().status == StatusCode::kUnauthenticated && h.value().length == 0) {
          result = Status::Unauthenticated(who + " requires the cluster secret (" +
                                           auth::kKeyFileEnv + ")");
          return;
        }
        if (h.value().opcode != wire::Opcode::kDescriptor || h.value().id != 1 ||
            h.value().status != StatusCode::kOk || h.value().length > kMaxDescriptorBytes) {
          result = Status::ProtocolError(who + " sent an unexpected reply");
          return;
        }
        payload.resize(h.value().length);
        asio::async_read(sock, asio::buffer(payload), [&](asio::error_code ec, size_t) {
          if (ec) {
            result = Status::ConnectionLost(who + " closed: " + ec.message());
            return;
          }
          auto d = DecodeDescriptor(payload.data(), payload.size());
          if (!d.ok()) {
            result = d.status();
            return;
          }
          desc = std::move(d).value();
          result = Status::Ok();
        });
      });
    });
  };

  tcp::endpoint ep(asio::ip::make_address(addr.host), addr.port);
  sock.async_connect(ep, [&](asio::error_code ec) {
    if (ec) {
      result = Status::Unavailable("cannot connect to " + who + ": " + ec.message());
      return;
    }
    // Without a secret the fetch needs no Hello: a target without one serves it.
    if (key == nullptr) return ask();
    handshake::HelloConfig hc;
    hc.key = key;
    hc.peer_name = who;
    handshake::AsyncHello(sock, std::move(hc), [&](Status st, uint64_t) {
      if (!st.ok()) {
        result = std::move(st);
        return;
      }
      ask();
    });
  });
  io.run_for(timeout);
  if (!result.ok()) return result;
  return desc;
}

}  // namespace ferry

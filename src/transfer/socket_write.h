// Gathered writes of the data path: asio::async_write without its 64 KiB
// ceiling per send.
#pragma once

#include <asio.hpp>
#include <cstddef>
#include <utility>

#include "common/env.h"

namespace ferry {

// asio's async_write hands the socket at most 64 KiB per send (its
// default_max_transfer_size), each further piece another trip through the
// io_context: a 512 KiB chunk took 8 sendmsg calls where a blocking send takes
// one. With this, a send takes all the socket buffer accepts (asio still
// gathers at most 64 buffers per call).
struct WholeSends {
  size_t operator()(const asio::error_code& ec, size_t) const { return ec ? 0 : size_t{1} << 30; }
};

// FERRY_TCP_WHOLE_SENDS, read once: 1 (the default) or 0, asio's 64 KiB
// sends as before, a knob to compare.
inline bool WholeSendsOn() {
  static const bool on = env::GetIntIn("FERRY_TCP_WHOLE_SENDS", 0, 1, 1) == 1;
  return on;
}

// asio::async_write(stream, buffers, handler) in as few sends as the socket
// allows; the same completion.
template <typename Stream, typename Buffers, typename Handler>
void AsyncWriteAll(Stream& stream, const Buffers& buffers, Handler&& handler) {
  if (!WholeSendsOn()) return asio::async_write(stream, buffers, std::forward<Handler>(handler));
  asio::async_write(stream, buffers, WholeSends{}, std::forward<Handler>(handler));
}

}  // namespace ferry

// The engine's two submit paths: Submit (the transports' own threads move the
// data, after a readiness event) and SubmitOnStream (everything is ordered on
// the caller's stream, R5).
#pragma once

#include <memory>
#include <span>

#include "common/clock.h"
#include "ferry/types.h"
#include "transfer/router.h"

namespace ferry {

namespace gpu {
class Copier;
}
class Batch;
class PeerTable;
class StreamRelay;
struct SubmitOptions;

class Submitter {
 public:
  // `copier` and `relay` are null without a GPU; all must outlive this.
  Submitter(Router& router, PeerTable& peers, gpu::Copier* copier, StreamRelay* relay,
            Millis request_timeout)
      : router_(router),
        peers_(peers),
        copier_(copier),
        relay_(relay),
        request_timeout_(request_timeout) {}

  // Engine::Submit.
  Result<std::unique_ptr<Batch>> Submit(std::span<const Request> reqs, const SubmitOptions& opts);
  // Engine::SubmitOnStream.
  Result<std::unique_ptr<Batch>> SubmitOnStream(std::span<const Request> reqs, void* stream);

 private:
  Router& router_;
  PeerTable& peers_;
  gpu::Copier* const copier_;
  StreamRelay* const relay_;
  const Millis request_timeout_;
};

}  // namespace ferry

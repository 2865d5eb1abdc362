#include "transfer/handshake.h"

#include <cstring>

#include "transfer/frame_wire.h"

namespace ferry::handshake {

namespace {

using asio::ip::tcp;
using wire::Header;
using wire::Opcode;

auth::Mac Proof(const auth::Key& key, std::string_view label, const auth::Nonce& initiator,
                const auth::Nonce& target, uint64_t target_epoch, uint64_t expected_epoch) {
  const auto te = auth::Le64(target_epoch), ee = auth::Le64(expected_epoch);
  return key.Sign(label, {initiator, target, te, ee});
}

constexpr size_t kChallengeBytes = auth::kNonceBytes + auth::kMacBytes;

// One exchange; it keeps itself alive through its handlers.
class Hello : public std::enable_shared_from_this<Hello> {
 public:
  Hello(tcp::socket& sock, HelloConfig cfg, std::function<void(Status, uint64_t)> done)
      : sock_(sock), cfg_(std::move(cfg)), done_(std::move(done)) {}

  void Start() {
    size_t n = wire::kHeaderSize;
    if (cfg_.key) {
      auto nonce = auth::NewNonce();
      if (!nonce.ok()) return Finish(nonce.status());
      mine_ = nonce.value();
      std::memcpy(out_ + wire::kHeaderSize, mine_.data(), mine_.size());
      n += mine_.size();
    }
    wire::EncodeHeader(
        {Opcode::kHello, StatusCode::kOk, 0, cfg_.expected_epoch, cfg_.key ? auth::kNonceBytes : 0},
        out_);
    Send(n);
  }

 private:
  void Send(size_t n) {
    asio::async_write(sock_, asio::buffer(out_, n), [self = shared_from_this()](auto ec, size_t) {
      if (!self->cfg_.current()) return;
      if (ec)
        return self->Finish(Status::ConnectionLost(self->cfg_.peer_name + ": " + ec.message()));
      self->ReadReply();
    });
  }

  void ReadReply() {
    asio::async_read(sock_, asio::buffer(in_), [self = shared_from_this()](auto ec, size_t) {
      if (!self->cfg_.current()) return;
      if (ec) {
        return self->Finish(
            Status::ConnectionLost(self->cfg_.peer_name + " closed during the handshake"));
      }
      self->OnReply();
    });
  }

  void OnReply() {
    auto dh = wire::DecodeHeader(in_);
    if (!dh.ok()) return Finish(Status::ProtocolError(cfg_.peer_name + " sent a bad hello reply"));
    const Header h = dh.value();
    if (h.opcode == Opcode::kChallenge && cfg_.key && !proved_ && h.status == StatusCode::kOk &&
        h.length == kChallengeBytes) {
      epoch_ = h.addr;
      asio::async_read(
          sock_, asio::buffer(challenge_), [self = shared_from_this()](auto ec, size_t) {
            if (!self->cfg_.current()) return;
            if (ec) {
              return self->Finish(
                  Status::ConnectionLost(self->cfg_.peer_name + " closed during the handshake"));
            }
            self->OnChallenge();
          });
      return;
    }
    if (h.opcode != Opcode::kHelloAck || h.length != 0) {
      return Finish(Status::ProtocolError(cfg_.peer_name + " sent a bad hello reply"));
    }
    if (h.status == StatusCode::kUnauthenticated) {
      return Finish(Status::Unauthenticated(
          cfg_.peer_name + (proved_ ? " refused this side's proof: its cluster secret differs"
                                    : " requires the cluster secret (FERRY_AUTH_KEY_FILE)")));
    }
    if (cfg_.key && !proved_) {
      // A target without the secret, or one pretending: nothing goes to it.
      return Finish(Status::Unauthenticated(
          cfg_.peer_name + " did not authenticate (it holds no cluster secret); refusing it"));
    }
    if (h.status == StatusCode::kPeerRestarted) {
      return Finish(
          Status::PeerRestarted(cfg_.peer_name + " restarted; its segment has a new epoch"),
          h.addr);
    }
    if (h.status != StatusCode::kOk) {
      return Finish(Status(h.status, cfg_.peer_name + " refused the hello"), h.addr);
    }
    Finish(Status::Ok(), h.addr);
  }

  void OnChallenge() {
    auth::Nonce theirs{};
    auth::Mac proof{};
    std::memcpy(theirs.data(), challenge_, theirs.size());
    std::memcpy(proof.data(), challenge_ + theirs.size(), proof.size());
    if (!auth::SameMac(proof, TargetProof(*cfg_.key, mine_, theirs, epoch_, cfg_.expected_epoch))) {
      return Finish(Status::Unauthenticated(cfg_.peer_name +
                                            " did not prove the cluster secret; refusing it"));
    }
    proved_ = true;
    const auth::Mac answer = InitiatorProof(*cfg_.key, mine_, theirs, epoch_, cfg_.expected_epoch);
    wire::EncodeHeader({Opcode::kProof, StatusCode::kOk, 0, 0, answer.size()}, out_);
    std::memcpy(out_ + wire::kHeaderSize, answer.data(), answer.size());
    Send(wire::kHeaderSize + answer.size());
  }

  void Finish(Status st, uint64_t epoch = 0) {
    if (auto done = std::exchange(done_, nullptr)) done(std::move(st), epoch);
  }

  tcp::socket& sock_;
  const HelloConfig cfg_;
  std::function<void(Status, uint64_t)> done_;
  auth::Nonce mine_{};
  bool proved_ = false;  // the target proved the key; our proof is sent
  uint64_t epoch_ = 0;   // the target's, from its challenge
  uint8_t out_[wire::kHeaderSize + auth::kNonceBytes];
  uint8_t in_[wire::kHeaderSize];
  uint8_t challenge_[kChallengeBytes];
};

}  // namespace

auth::Mac TargetProof(const auth::Key& key, const auth::Nonce& initiator, const auth::Nonce& target,
                      uint64_t target_epoch, uint64_t expected_epoch) {
  return Proof(key, "ferry listener v2 target", initiator, target, target_epoch, expected_epoch);
}

auth::Mac InitiatorProof(const auth::Key& key, const auth::Nonce& initiator,
                         const auth::Nonce& target, uint64_t target_epoch,
                         uint64_t expected_epoch) {
  return Proof(key, "ferry listener v2 initiator", initiator, target, target_epoch, expected_epoch);
}

void AsyncHello(tcp::socket& sock, HelloConfig config, std::function<void(Status, uint64_t)> done) {
  std::make_shared<Hello>(sock, std::move(config), std::move(done))->Start();
}

}  // namespace ferry::handshake

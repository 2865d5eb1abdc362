#include "store/node/attach_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "common/bytes.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "gpu/gpu.h"
#include "gpu/interprocess.h"
#include "store/node/attach_session.h"
#include "store/node/core.h"
#include "store/rpc/attach_wire.h"

namespace ferry::store {
Result<std::unique_ptr<AttachServer>> AttachServer::Start(StoreCore& core, AttachOptions options) {
  sockaddr_un sa{};
  if (options.path.empty() || options.path.size() >= sizeof(sa.sun_path)) {
    return Status::InvalidArgument("a socket path of 1 to " +
                                   std::to_string(sizeof(sa.sun_path) - 1) + " bytes");
  }
  struct stat sb {};
  if (lstat(options.path.c_str(), &sb) == 0) {
    if (!S_ISSOCK(sb.st_mode)) {
      return Status::AlreadyExists(options.path + " exists and is not a socket");
    }
    unlink(options.path.c_str());  // a stale socket of an earlier node
  }
  std::random_device random;
  const uint64_t instance = random() | (uint64_t{random()} << 32);
  std::unique_ptr<AttachServer> s(new AttachServer(core, options, instance));
  s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return Status::FromErrno(errno, "socket");
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, options.path.c_str(), options.path.size());
  if (bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    return Status::FromErrno(errno, "bind " + options.path);
  }
  // Before listen, so that nobody connects while the mode is still wider.
  // Owner only; with allowed uids, anyone may connect and SO_PEERCRED decides.
  const mode_t mode = options.allow_uids.empty() ? 0600 : 0666;
  if (chmod(options.path.c_str(), mode) != 0) return Status::FromErrno(errno, "chmod");
  if (listen(s->listen_fd_, 128) != 0) return Status::FromErrno(errno, "listen");
  s->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd_ < 0) return Status::FromErrno(errno, "eventfd");
  s->acceptor_ = std::thread([p = s.get()] {
    NameThisThread("ferry-attach");
    p->AcceptLoop();
  });
  FERRY_LOG_INFO("attach: serving {} (uid {} and root{})", options.path, geteuid(),
                 options.allow_uids.empty() ? "" : " and the allowed uids");
  return s;
}

AttachServer::~AttachServer() {
  stop_ = true;
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    acceptor_.join();
  }
  {
    std::lock_guard lock(mu_);
    for (Client& c : clients_) shutdown(c.fd, SHUT_RDWR);
  }
  Reap(true);
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(options_.path.c_str());
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

AttachServer::AttachServer(StoreCore& core, AttachOptions options, uint64_t instance)
    : core_(core),
      options_(std::move(options)),
      instance_(instance),
      refusals_(std::make_unique<log::Refusals>("attach " + options_.path)) {}

uint64_t AttachServer::auth_failures() const { return refusals_->count(); }

size_t AttachServer::clients() const {
  std::lock_guard lock(mu_);
  return clients_.size();
}

void AttachServer::Reap(bool all) {
  std::list<Client> finished;
  {
    std::lock_guard lock(mu_);
    for (auto it = clients_.begin(); it != clients_.end();) {
      auto next = std::next(it);
      if (all || it->done) finished.splice(finished.end(), clients_, it);
      it = next;
    }
  }
  for (Client& c : finished) {
    c.thread.join();
    close(c.fd);
  }
}

// Refused connections kept at once to be told why; past these, closed unanswered.
constexpr size_t kMaxRefusing = 8;

std::string AttachServer::Room(uint32_t uid, bool trusted) const {
  size_t admitted = 0, of_uid = 0;
  for (const Client& c : clients_) {
    if (!c.admitted || c.done) continue;
    ++admitted;
    if (c.uid == uid) ++of_uid;
  }
  if (admitted >= options_.max_clients) {
    return "the node serves at most " + std::to_string(options_.max_clients) + " clients";
  }
  if (!trusted && of_uid >= options_.max_clients_per_uid) {
    return "the node serves at most " + std::to_string(options_.max_clients_per_uid) +
           " clients of uid " + std::to_string(uid);
  }
  return "";
}

void AttachServer::AcceptLoop() {
  while (!stop_) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int r = poll(p, 2, 1000);
    Reap(false);
    if (r <= 0 || (p[1].revents & POLLIN)) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    ucred cred{};
    socklen_t len = sizeof(cred);
    const bool known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    const bool trusted = known && (cred.uid == 0 || cred.uid == geteuid());
    std::string refusal;
    if (!known) {
      refusal = "the node cannot read this process's credentials";
    } else if (!trusted && std::find(options_.allow_uids.begin(), options_.allow_uids.end(),
                                     cred.uid) == options_.allow_uids.end()) {
      refusal = "uid " + std::to_string(cred.uid) + " may not attach to this node (--allow-uid)";
    }
    std::lock_guard lock(mu_);
    if (refusal.empty()) refusal = Room(cred.uid, trusted);
    if (!refusal.empty()) {
      FERRY_LOG_WARN("attach {}: refusing pid {}: {}", options_.path, cred.pid, refusal);
      size_t refusing = 0;
      for (const Client& k : clients_) refusing += !k.admitted && !k.done;
      if (refusing >= kMaxRefusing) {
        close(fd);
        continue;
      }
    }
    Client& c = clients_.emplace_back();
    c.fd = fd;
    c.uid = cred.uid;
    c.admitted = refusal.empty();
    c.thread = std::thread([this, &c, refusal, cred] {
      NameThisThread("ferry-attached");
      AttachSession(core_, options_, instance_, c.fd,
                    "pid " + std::to_string(cred.pid) + " (uid " + std::to_string(cred.uid) + ")",
                    *refusals_)
          .Run(refusal.empty(), refusal);
      c.done = true;
    });
  }
}

}  // namespace ferry::store

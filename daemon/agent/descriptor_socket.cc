#include "daemon/agent/descriptor_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/unguessable.h"
#include "daemon/agent/local_socket.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {
absl::StatusOr<std::unique_ptr<DescriptorSocket>> DescriptorSocket::Listen(const std::string& path,
                                                                           const std::string& group,
                                                                           TargetDescriptors targets, Limits limits) {
  absl::StatusOr<int> fd = ListenUnix(path, group, SOCK_SEQPACKET);
  if (!fd.ok()) return fd.status();
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(*fd);
    unlink(path.c_str());
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<DescriptorSocket> socket(new DescriptorSocket(*fd, wake, path, std::move(targets), limits));
  socket->serving_ = std::thread([s = socket.get()] { s->Serve(); });
  return socket;
}

DescriptorSocket::DescriptorSocket(int fd, int wake, std::string path, TargetDescriptors targets, Limits limits)
    : fd_(fd), wake_(wake), path_(std::move(path)), targets_(std::move(targets)), limits_(limits) {}

DescriptorSocket::~DescriptorSocket() {
  const uint64_t one = 1;
  if (write(wake_.get(), &one, sizeof(one)) < 0)
    spdlog::error("waking the descriptor socket: {}", std::strerror(errno));
  if (serving_.joinable()) serving_.join();
  unlink(path_.c_str());
}

void DescriptorSocket::Serve() {
  std::vector<pollfd> polled;
  while (true) {
    polled.clear();
    polled.push_back({wake_.get(), POLLIN, 0});
    polled.push_back({fd_.get(), POLLIN, 0});
    for (const auto& [fd, connection] : connections_) polled.push_back({fd, POLLIN, 0});
    if (poll(polled.data(), polled.size(), -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("the descriptor socket {} stops serving: poll: {}", path_, std::strerror(errno));
      break;
    }
    if (polled[0].revents != 0) break;
    for (size_t i = 2; i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      const int fd = polled[i].fd;
      if (!Answer(connections_.at(fd))) {
        Drop(fd);
        connections_.erase(fd);
      }
    }
    if (polled[1].revents != 0) Accept();
  }
  for (const auto& [fd, connection] : connections_) Drop(fd);
  connections_.clear();
}

void DescriptorSocket::Accept() {
  UniqueFd connection(accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!connection.valid()) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
      spdlog::error("accepting on {}: {}", path_, std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(100));  // out of descriptors: let it pass
    }
    return;
  }
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (getsockopt(connection.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return;
  if (static_cast<int32_t>(connections_.size()) >= limits_.connections) {
    spdlog::warn("descriptor socket {}: {} connections are open, its limit; pid {}'s is closed", path_,
                 connections_.size(), credentials.pid);
    return;
  }
  const int fd = connection.get();
  connections_[fd] = Connection{std::move(connection), credentials.pid, credentials.uid};
}

bool DescriptorSocket::Answer(const Connection& connection) {
  std::string request;
  std::vector<UniqueFd> descriptors;
  const absl::StatusOr<bool> read = ReceiveMessage(connection.fd.get(), &request, &descriptors);
  const auto answer = [&](const std::string& payload, const std::vector<int>& passed = {}) {
    // Never waits: a peer that reads no answers loses its connection.
    return SendMessage(connection.fd.get(), payload, passed, MSG_DONTWAIT).ok();
  };
  // A broken connection ends; a message refused (too many descriptors or bytes) is answered.
  if (!read.ok()) return !absl::IsUnavailable(read.status()) && answer(absl::StrCat("E", read.status().message()));
  if (!*read) return true;                                   // nothing after all
  if (request.empty() && descriptors.empty()) return false;  // closed
  if (request == "P") {
    if (descriptors.empty()) return answer("Ea put carries at least one descriptor");
    const std::string token = UnguessableHex();
    int32_t waiting = -1;  // set when the put is refused
    {
      absl::MutexLock lock(&mu_);
      if (waiting_ + static_cast<int32_t>(descriptors.size()) > limits_.waiting) {
        waiting = waiting_;
      } else {
        waiting_ += static_cast<int32_t>(descriptors.size());
        puts_[token] = Put{connection.pid, connection.fd.get(), std::move(descriptors)};
      }
    }
    if (waiting >= 0) {
      return answer(absl::StrCat("E", waiting, " descriptors wait to be registered on this agent, its limit; ",
                                 "register those first"));
    }
    return answer("T" + token);
  }
  if (request[0] == 'F' && descriptors.empty()) {
    if (connection.uid != geteuid() && connection.uid != 0) {
      return answer(absl::StrCat("Euid ", connection.uid, " may not fetch descriptors: only this agent's uid (",
                                 geteuid(), ") and root fetch, for the direct path"));
    }
    absl::StatusOr<std::vector<UniqueFd>> found = targets_(request.substr(1));
    if (!found.ok()) return answer(absl::StrCat("E", found.status().message()));
    std::vector<int> passed;
    for (const UniqueFd& fd : *found) passed.push_back(fd.get());
    return answer("D", passed);
  }
  return answer("Eunknown request: a put is \"P\" with descriptors, a fetch \"F<token>\" without");
}

void DescriptorSocket::Drop(int connection) {
  absl::MutexLock lock(&mu_);
  for (auto it = puts_.begin(); it != puts_.end();) {
    if (it->second.connection != connection) {
      ++it;
      continue;
    }
    waiting_ -= static_cast<int32_t>(it->second.descriptors.size());
    it = puts_.erase(it);
  }
}

absl::StatusOr<std::vector<UniqueFd>> DescriptorSocket::Claim(const std::string& token, int32_t pid) {
  absl::MutexLock lock(&mu_);
  auto it = puts_.find(token);
  if (it == puts_.end()) {
    return absl::NotFoundError(absl::StrCat("no descriptors wait under token '", token,
                                            "' on this agent's descriptor socket (never put, already registered, "
                                            "or the connection that put them closed)"));
  }
  if (it->second.pid != pid) {
    return absl::PermissionDeniedError(absl::StrCat("the descriptors under token '", token, "' were put by pid ",
                                                    it->second.pid, ", not by the registering process (pid ", pid,
                                                    ")"));
  }
  std::vector<UniqueFd> descriptors = std::move(it->second.descriptors);
  waiting_ -= static_cast<int32_t>(descriptors.size());
  puts_.erase(it);
  return descriptors;
}

int32_t DescriptorSocket::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

}  // namespace shardsync::agent

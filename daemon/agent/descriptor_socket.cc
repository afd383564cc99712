#include "daemon/agent/descriptor_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/unguessable.h"
#include "daemon/agent/local_socket.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {
namespace {

constexpr size_t kMaxMessage = 1024;  // bytes of a request or an answer, descriptors aside

// One message and the descriptors it carries; fails without blocking if the socket
// cannot take it now and `flags` has MSG_DONTWAIT.
absl::Status Send(int socket, const std::string& payload, const std::vector<int>& descriptors, int flags) {
  iovec io{const_cast<char*>(payload.data()), payload.size()};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * descriptors.size()));
  if (!descriptors.empty()) {
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int) * descriptors.size());
    std::memcpy(CMSG_DATA(header), descriptors.data(), sizeof(int) * descriptors.size());
  }
  while (true) {
    if (sendmsg(socket, &message, flags | MSG_NOSIGNAL) >= 0) return absl::OkStatus();
    if (errno != EINTR) return absl::UnavailableError(absl::StrCat("sendmsg: ", std::strerror(errno)));
  }
}

// One message; its descriptors are ours (closed if the message is refused). OK with an
// empty payload and no descriptors: the other end closed.
absl::Status Receive(int socket, std::string* payload, std::vector<UniqueFd>* descriptors) {
  char data[kMaxMessage];
  iovec io{data, sizeof(data)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxDescriptors)];
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    got = recvmsg(socket, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return absl::UnavailableError(absl::StrCat("recvmsg: ", std::strerror(errno)));
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(header) + i * sizeof(int), sizeof(int));
      descriptors->emplace_back(fd);
    }
  }
  payload->assign(data, static_cast<size_t>(got));
  if (message.msg_flags & MSG_CTRUNC) {
    return absl::InvalidArgumentError(absl::StrCat("more than ", kMaxDescriptors, " descriptors in one message"));
  }
  if (message.msg_flags & MSG_TRUNC) {
    return absl::InvalidArgumentError(absl::StrCat("a message longer than ", kMaxMessage, " bytes"));
  }
  return absl::OkStatus();
}

// Waits until `socket` can be read, or `deadline`.
absl::Status AwaitReadable(int socket, absl::Time deadline) {
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return absl::DeadlineExceededError("no answer on the descriptor socket before the deadline");
    pollfd wait{socket, POLLIN, 0};
    const int ready = poll(&wait, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready > 0) return absl::OkStatus();
    if (ready < 0 && errno != EINTR) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
  }
}

// The answer to a request, its error turned back into a status.
absl::StatusOr<std::string> Ask(int socket, const std::string& request, const std::vector<int>& descriptors,
                                absl::Time deadline, std::vector<UniqueFd>* received) {
  if (absl::Status sent = Send(socket, request, descriptors, 0); !sent.ok()) return sent;
  if (absl::Status ready = AwaitReadable(socket, deadline); !ready.ok()) return ready;
  std::string answer;
  if (absl::Status got = Receive(socket, &answer, received); !got.ok()) return got;
  if (answer.empty()) return absl::UnavailableError("the descriptor socket closed the connection");
  if (answer[0] == 'E') return absl::FailedPreconditionError(answer.substr(1));
  return answer;
}

}  // namespace

std::string DescriptorSocketPath(const std::string& socket_path) { return socket_path + ".fds"; }

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
  const absl::Status received = Receive(connection.fd.get(), &request, &descriptors);
  if (received.ok() && request.empty() && descriptors.empty()) return false;  // closed
  if (!received.ok() && absl::IsUnavailable(received)) return false;
  const auto answer = [&](const std::string& payload, const std::vector<int>& passed = {}) {
    // Never waits: a peer that reads no answers loses its connection.
    return Send(connection.fd.get(), payload, passed, MSG_DONTWAIT).ok();
  };
  if (!received.ok()) return answer(absl::StrCat("E", received.message()));
  if (request == "P") {
    if (descriptors.empty()) return answer("Ea put carries at least one descriptor");
    std::string token = UnguessableHex();
    {
      absl::MutexLock lock(&mu_);
      if (waiting_ + static_cast<int32_t>(descriptors.size()) > limits_.waiting) {
        return answer(absl::StrCat("E", waiting_,
                                   " descriptors wait to be registered on this agent, its limit; "
                                   "register those first"));
      }
      waiting_ += static_cast<int32_t>(descriptors.size());
      puts_[token] = Put{connection.pid, connection.fd.get(), std::move(descriptors)};
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

absl::StatusOr<UniqueFd> ConnectDescriptorSocket(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("descriptor socket path '", path, "' is too long"));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the descriptor socket ", path, ": ", std::strerror(errno)));
  }
  return fd;
}

absl::StatusOr<std::vector<UniqueFd>> FetchDescriptors(const std::string& path, const std::string& token,
                                                       absl::Time deadline) {
  absl::StatusOr<UniqueFd> connection = ConnectDescriptorSocket(path);
  if (!connection.ok()) return connection.status();
  std::vector<UniqueFd> received;
  absl::StatusOr<std::string> answer = Ask(connection->get(), "F" + token, {}, deadline, &received);
  if (!answer.ok()) {
    return absl::Status(answer.status().code(),
                        absl::StrCat("fetching descriptors from ", path, ": ", answer.status().message()));
  }
  if (*answer != "D" || received.empty()) {
    return absl::InternalError(absl::StrCat("the descriptor socket ", path, " answered a fetch with '", *answer,
                                            "' and ", received.size(), " descriptors"));
  }
  return received;
}

absl::StatusOr<std::string> PutDescriptors(int connection, const std::vector<int>& descriptors, absl::Time deadline) {
  std::vector<UniqueFd> received;
  absl::StatusOr<std::string> answer = Ask(connection, "P", descriptors, deadline, &received);
  if (!answer.ok()) return answer.status();
  if ((*answer)[0] != 'T' || !received.empty()) {
    return absl::InternalError(absl::StrCat("the descriptor socket answered a put with '", *answer, "'"));
  }
  return answer->substr(1);
}

}  // namespace shardsync::agent

#include "common/descriptor_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardsync {
namespace {

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
  if (absl::Status sent = SendMessage(socket, request, descriptors, 0); !sent.ok()) return sent;
  std::string answer;
  while (true) {
    if (absl::Status ready = AwaitReadable(socket, deadline); !ready.ok()) return ready;
    absl::StatusOr<bool> got = ReceiveMessage(socket, &answer, received);
    if (!got.ok()) return got.status();
    if (*got) break;
  }
  if (answer.empty()) return absl::UnavailableError("the descriptor socket closed the connection");
  if (answer[0] == 'E') return absl::FailedPreconditionError(answer.substr(1));
  return answer;
}

}  // namespace

std::string DescriptorSocketPath(const std::string& socket_path) { return socket_path + ".fds"; }

absl::Status SendMessage(int socket, const std::string& payload, const std::vector<int>& descriptors, int flags) {
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

absl::StatusOr<bool> ReceiveMessage(int socket, std::string* payload, std::vector<UniqueFd>* descriptors) {
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
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
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
  return true;
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

}  // namespace shardsync

#include "daemon/agent/local_socket.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {

absl::StatusOr<int> ListenUnix(const std::string& path, const std::string& group, int type) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", path, "' is longer than ", sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  // Only a stale socket of an earlier run is replaced: never another file, nor a socket
  // something still serves.
  struct stat existing {};
  if (lstat(path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket; not replacing it"));
    }
    const int probe = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    const bool served = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    if (probe >= 0) close(probe);
    if (served) return absl::FailedPreconditionError(absl::StrCat("another process serves the socket ", path));
    unlink(path.c_str());
  }
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // Created as 0660 (owner and group: who may register buffers), never wider for a moment.
  const mode_t mask = umask(0117);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  const int bind_error = errno;
  umask(mask);
  if (!bound || listen(fd, 64) != 0) {
    const int error = bound ? errno : bind_error;
    close(fd);
    return absl::InternalError(absl::StrCat("cannot listen on ", path, ": ", std::strerror(error)));
  }
  if (!group.empty()) {
    const struct group* g = getgrnam(group.c_str());
    if (g == nullptr || chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
      close(fd);
      unlink(path.c_str());
      return absl::PermissionDeniedError(absl::StrCat("cannot give the socket ", path, " to group ", group));
    }
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<LocalSocket>> LocalSocket::Listen(const std::string& path, const std::string& group) {
  absl::StatusOr<int> fd = ListenUnix(path, group, SOCK_STREAM);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<LocalSocket>(new LocalSocket(*fd, path));
}

LocalSocket::~LocalSocket() {
  stopping_ = true;
  shutdown(fd_, SHUT_RDWR);  // wakes accept()
  if (accepting_.joinable()) accepting_.join();
  close(fd_);
  unlink(path_.c_str());
}

void LocalSocket::Serve(grpc::Server* server) {
  accepting_ = std::thread([this, server] { Accept(server); });
}

void LocalSocket::Accept(grpc::Server* server) {
  while (true) {
    // Non-blocking, as gRPC's own accepted sockets are: its poller must never wait in read().
    const int connection = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: say so and keep serving once it passes.
      spdlog::error("accepting a client on {}: {}; trying again", path_, std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    ucred credentials{};
    socklen_t length = sizeof(credentials);
    if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
      spdlog::warn("a local connection without peer credentials is closed: {}", std::strerror(errno));
      close(connection);
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      peers_[connection] = Peer{credentials.pid, credentials.uid};
    }
    grpc::AddInsecureChannelFromFd(server, connection);  // gRPC owns and closes it
  }
}

std::optional<Peer> LocalSocket::Find(const std::string& grpc_peer) const {
  // gRPC names a connection it was handed "fd:N".
  int fd = -1;
  if (grpc_peer.rfind("fd:", 0) != 0 || !absl::SimpleAtoi(grpc_peer.substr(3), &fd)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

}  // namespace shardsync::agent

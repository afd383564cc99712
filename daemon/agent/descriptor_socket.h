// The agent's descriptor socket: memory that has no name another process can open (a
// memfd, a torch storage shared by descriptor) reaches the agent as file descriptors,
// which gRPC cannot carry. A unix SOCK_SEQPACKET socket beside the agent's unix socket
// (DescriptorSocketPath), with the same mode and group, speaking
// common/descriptor_passing.h. A put's descriptors wait for the registration that
// names its token (MemoryHandle.descriptor_token), made by the same process; the
// connection that put them closing first closes them. A fetch is a same-node peer
// agent's (a connection of this agent's uid, or root), for a registered TARGET's
// descriptors (the direct path writes it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/descriptor_passing.h"
#include "common/unique_fd.h"

namespace shardsync::agent {

class DescriptorSocket {
 public:
  // A registered TARGET's descriptors by their token, duplicated for a fetch; NOT_FOUND
  // or PERMISSION_DENIED naming it.
  using TargetDescriptors = std::function<absl::StatusOr<std::vector<UniqueFd>>(const std::string& token)>;
  struct Limits {
    int32_t connections = 256;  // open at once; one past it is closed at once
    // Descriptors put and not yet claimed, in all: each adapter's parameter is a buffer,
    // so a registration may pass tens of thousands.
    int32_t waiting = 1 << 16;
  };

  // Listens on `path` (ListenUnix) and serves on a thread of its own.
  static absl::StatusOr<std::unique_ptr<DescriptorSocket>> Listen(const std::string& path, const std::string& group,
                                                                  TargetDescriptors targets, Limits limits);
  ~DescriptorSocket();  // stops, closes every connection and waiting descriptor, removes the file

  // Takes the descriptors put under `token`, by process `pid` alone: NOT_FOUND naming
  // the token when none wait under it (never put, taken, or their connection closed),
  // PERMISSION_DENIED when another process put them.
  absl::StatusOr<std::vector<UniqueFd>> Claim(const std::string& token, int32_t pid);
  // How many descriptors wait to be claimed.
  int32_t waiting() const;

 private:
  struct Connection {
    UniqueFd fd;
    int32_t pid = 0;
    uint32_t uid = 0;
  };
  struct Put {
    int32_t pid = 0;
    int connection = -1;  // the fd of the connection that put them
    std::vector<UniqueFd> descriptors;
  };

  DescriptorSocket(int fd, int wake, std::string path, TargetDescriptors targets, Limits limits);
  void Serve();
  void Accept();
  // Reads one request and answers it; false when the connection is to be closed.
  bool Answer(const Connection& connection);
  void Drop(int connection);  // the descriptors it put and not yet claimed

  const UniqueFd fd_;
  const UniqueFd wake_;  // an eventfd: written to stop Serve
  const std::string path_;
  const TargetDescriptors targets_;
  const Limits limits_;
  std::map<int, Connection> connections_;  // Serve's alone, by fd
  std::thread serving_;
  mutable absl::Mutex mu_;
  std::map<std::string, Put> puts_ ABSL_GUARDED_BY(mu_);  // by token
  int32_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardsync::agent

// The agent's unix socket, accepted here rather than by gRPC: each connection's peer
// credentials (SO_PEERCRED: pid, uid) are read when it is accepted, then the connection
// is handed to the gRPC server. A call finds its caller by ServerContext::peer().
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/agent/registry.h"
#include "grpcpp/server.h"

namespace shardsync::agent {

// A unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET) listening on `path`: a stale
// socket file of an earlier run is replaced, anything else refused; mode 0660, owned by
// group `group` when one is named.
absl::StatusOr<int> ListenUnix(const std::string& path, const std::string& group, int type);

class LocalSocket {
 public:
  // Listens on `path` (a stale file is replaced) with mode 0660, owned by group `group`
  // when one is named: its members may connect.
  static absl::StatusOr<std::unique_ptr<LocalSocket>> Listen(const std::string& path, const std::string& group);
  ~LocalSocket();  // stops accepting and removes the file

  // Hands every connection to `server` (built with no ports of its own) from now on.
  void Serve(grpc::Server* server);
  // The process behind the connection a call came on.
  std::optional<Peer> Find(const std::string& grpc_peer) const;

 private:
  LocalSocket(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Accept(grpc::Server* server);

  const int fd_;
  const std::string path_;
  std::atomic<bool> stopping_{false};
  std::thread accepting_;
  mutable absl::Mutex mu_;
  std::map<int, Peer> peers_ ABSL_GUARDED_BY(mu_);  // by connection fd (reused: overwritten)
};

}  // namespace shardsync::agent

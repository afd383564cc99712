// The agent's gRPC channels to its peers (AgentControl), one per address, made when
// first used and shared by everything that calls a peer: the host transport's
// Transfer and the direct path's TargetMemory. Drop forgets them all, so the next call
// connects afresh (a connection that lived through a cut link may still hold lost
// packets whose retransmission, backed off, would fail it after the link healed).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/tls.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::agent {

class PeerChannels {
 public:
  explicit PeerChannels(Credentials credentials) : credentials_(std::move(credentials)) {}

  // The stub of `address`'s channel; a caller keeps it while its call runs.
  std::shared_ptr<v1::AgentControl::Stub> Stub(const std::string& address);
  void Drop();

 private:
  const Credentials credentials_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<v1::AgentControl::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardsync::agent

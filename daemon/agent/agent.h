// shardsync-agent: one per device. The agent's jobs, each a class with its own state
// and lock, wired here: the ClientDesk takes local clients' registrations into the
// Registry; the PeerDesk hands this rank's targets to same-node peers; the SyncDesk
// prepares (through the Preparer) and executes syncs, keeping what it knows in the
// SyncLedger. The gRPC services (services.h) translate calls to these; this class
// only forwards, and reports status and metrics across the parts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/agent/client_desk.h"
#include "daemon/agent/coordinator_link.h"
#include "daemon/agent/descriptor_socket.h"
#include "daemon/agent/peer_desk.h"
#include "daemon/agent/preparer.h"
#include "daemon/agent/registry.h"
#include "daemon/agent/sync_desk.h"
#include "daemon/agent/sync_ledger.h"
#include "executor/device.h"
#include "executor/mailbox.h"
#include "executor/transport.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

struct AgentConfig {
  int32_t rank = 0;
  std::string device = "cpu";
  absl::Duration rpc_deadline = absl::Seconds(5);
  int64_t max_staging_bytes = int64_t{512} << 20;   // refuse larger budgets at Prepare
  int64_t delta_snapshot_bytes = int64_t{1} << 30;  // what the sent chunks kept for delta sync may hold
  // Who may register sources and targets: the uids of the unix socket's peers; empty:
  // the agent's own uid alone.
  std::vector<uint32_t> source_uids;
  std::vector<uint32_t> target_uids;
  // The descriptor socket's path, handed to same-node peers with a target passed as
  // descriptors (they fetch them there).
  std::string descriptor_socket;
};

class Agent {
 public:
  // `device` and `transport` are the data path (host memory and the agents' gRPC
  // channels, or a CUDA device and NCCL); `mailbox` takes peers' Transfer calls (host).
  // `descriptors`: the descriptor socket registrations claim from (none: refused).
  Agent(AgentConfig config, Registry& registry, CoordinatorLink& link, executor::Device& device,
        executor::Transport& transport, executor::Mailbox& mailbox, DirectPath direct = {},
        DescriptorSocket* descriptors = nullptr);

  int32_t rank() const { return config_.rank; }
  ClientDesk& clients() { return clients_; }
  v1::AgentStatus Status() const;
  // Prometheus text: registrations, syncs executed, bytes moved, target validity.
  std::string Metrics() const;

  // Agent service (unix socket): the client desk's.
  absl::Status Admit(const v1::RegisterRequest& request, const Peer& peer) { return clients_.Admit(request, peer); }
  void Withdraw(const std::string& client_id) { clients_.Withdraw(client_id); }

  // AgentControl service (TCP): the sync desk's and the peer desk's.
  v1::PrepareResponse Prepare(const v1::PrepareRequest& request) { return syncs_.Prepare(request); }
  absl::StatusOr<v1::ExecuteResponse> Execute(const v1::ExecuteRequest& request) { return syncs_.Execute(request); }
  void Abort(const v1::AbortRequest& request) { syncs_.Abort(request); }
  absl::Status Transfer(const v1::TransferRequest& request, absl::Time deadline) {
    return syncs_.Transfer(request, deadline);
  }
  absl::StatusOr<std::string> NewCommunicatorId() { return syncs_.NewCommunicatorId(); }
  v1::RankProgress Progress() const { return syncs_.Progress(); }
  absl::StatusOr<v1::TargetMemoryResponse> TargetMemory(const v1::TargetMemoryRequest& request) {
    return peers_.TargetMemory(request);
  }

 private:
  const AgentConfig config_;
  Registry& registry_;
  CoordinatorLink& link_;
  SyncLedger ledger_;
  PeerDesk peers_;
  Preparer preparer_;
  ClientDesk clients_;
  SyncDesk syncs_;
};

}  // namespace shardsync::agent

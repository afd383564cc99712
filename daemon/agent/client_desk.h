// The client desk: takes local trainers' and rollouts' registrations (Agent.Register on
// the unix socket) into the registry, if the calling process's uid may make them, and
// drops them when the client goes away (the service holds each registration's call). No lock of its own: the registry,
// the link and the ledger each guard their state.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/agent/coordinator_link.h"
#include "daemon/agent/descriptor_socket.h"
#include "daemon/agent/registry.h"
#include "daemon/agent/sync_ledger.h"
#include "executor/device.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

struct ClientDeskConfig {
  absl::Duration rpc_deadline = absl::Seconds(5);  // for the coordinator to take a registration
  // Who may register sources and targets: the uids of the unix socket's peers; empty:
  // the agent's own uid alone.
  std::vector<uint32_t> source_uids;
  std::vector<uint32_t> target_uids;
};

class ClientDesk {
 public:
  // `device` opens the sources' ready events; `ledger` learns of new targets.
  // `descriptors`: where registrations claim their descriptor tokens (none: refused).
  ClientDesk(ClientDeskConfig config, Registry& registry, CoordinatorLink& link, executor::Device& device,
             SyncLedger& ledger, DescriptorSocket* descriptors = nullptr)
      : config_(std::move(config)),
        registry_(registry),
        link_(link),
        device_(device),
        ledger_(ledger),
        descriptors_(descriptors) {}

  // Takes a registration if `peer` may make it and the registry accepts it.
  absl::Status Admit(const v1::RegisterRequest& request, const Peer& peer);
  // The layout epoch that holds every registration admitted so far, once the
  // coordinator took it; -1 if it did not within the RPC deadline.
  int64_t AwaitPublished() const;
  // Drops a client's registrations.
  void Withdraw(const std::string& client_id);
  // A registration is held until its client goes away or the agent shuts down.
  void Shutdown() { shutting_down_ = true; }
  bool shutting_down() const { return shutting_down_; }

 private:
  const ClientDeskConfig config_;
  Registry& registry_;
  CoordinatorLink& link_;
  executor::Device& device_;
  SyncLedger& ledger_;
  DescriptorSocket* const descriptors_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace shardsync::agent

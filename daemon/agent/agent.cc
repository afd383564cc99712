#include "daemon/agent/agent.h"

#include "common/metrics_http.h"

namespace shardsync::agent {
namespace {

DirectPath WithDesk(DirectPath direct, PeerDesk& desk) {
  direct.desk = &desk;
  return direct;
}

}  // namespace

Agent::Agent(AgentConfig config, Registry& registry, CoordinatorLink& link, executor::Device& device,
             executor::Transport& transport, executor::Mailbox& mailbox, DirectPath direct,
             DescriptorSocket* descriptors)
    : config_(std::move(config)),
      registry_(registry),
      link_(link),
      ledger_(config_.rank, link),
      peers_(config_.rank, registry, config_.rpc_deadline, config_.descriptor_socket),
      preparer_(PreparerConfig{config_.rank, config_.max_staging_bytes, config_.rpc_deadline}, registry, transport,
                WithDesk(direct, peers_)),
      clients_(ClientDeskConfig{config_.rpc_deadline, config_.source_uids, config_.target_uids}, registry, link, device,
               ledger_, descriptors),
      syncs_(config_.rank, config_.rpc_deadline, config_.delta_snapshot_bytes,
             SyncParts{registry, ledger_, preparer_, peers_, device, transport, mailbox, direct}) {}

v1::AgentStatus Agent::Status() const {
  v1::AgentStatus status;
  status.set_rank(config_.rank);
  status.set_device(config_.device);
  status.set_joined(link_.joined());
  for (v1::ClientInfo& client : registry_.Clients()) *status.add_clients() = std::move(client);
  status.set_last_sync_id(ledger_.last_sync_id());
  status.set_target_version(ledger_.target_version());
  status.set_target_valid(!status.target_version().empty());
  status.set_running_sync_id(ledger_.running_sync_id());
  return status;
}

std::string Agent::Metrics() const {
  int64_t buffers = 0, bytes = 0;
  const std::vector<v1::ClientInfo> clients = registry_.Clients();
  for (const v1::ClientInfo& c : clients) {
    buffers += c.buffers();
    bytes += c.bytes();
  }
  std::string out;
  AppendMetric(&out, "shardsync_agent_clients", "gauge", "Clients registered with this agent.",
               static_cast<double>(clients.size()));
  AppendMetric(&out, "shardsync_agent_registered_buffers", "gauge", "Buffers registered with this agent.", buffers);
  AppendMetric(&out, "shardsync_agent_registered_bytes", "gauge", "Bytes of the buffers registered here.", bytes);
  ledger_.AppendMetrics(&out);
  return out;
}

}  // namespace shardsync::agent

// shardsync-agent's flags (main.cc parses them; tests use the same declarations).
#pragma once

#include <cstdint>
#include <string>

#include "common/daemon_process.h"
#include "common/flags.h"
#include "daemon/agent/agent.h"
#include "daemon/agent/registry.h"
#include "daemon/coordinator/coordinator.h"

namespace shardsync::agent {

struct AgentFlags {
  AgentConfig agent;  // its device is set by FinishAgentFlags
  DaemonFlags daemon;
  bool serve_coordinator = false;
  coordinator::CoordinatorConfig coordinator_config;  // with serve_coordinator
  std::string coordinator, socket, listen = "127.0.0.1:0", advertise, port_file, socket_group, node;
  std::string device = "cpu";  // as given: cpu or a CUDA ordinal
  int ordinal = -1;            // the CUDA ordinal, -1 for cpu (FinishAgentFlags)
  int64_t rpc_deadline_ms = 5000;
  int64_t max_message_bytes = int64_t{64} << 20;
  RegistryLimits registrations;
  // Tests only (tests/e2e): with fault_stall, the n-th sync (fault_stall_sync) to reach
  // round fault_stall_at_round stalls there (executor/fault_transport.h).
  bool fault_stall = false;  // --fault-stall-at-round was given
  int32_t fault_stall_at_round = 0;
  int32_t fault_stall_sync = 1;
};

// Adds every flag of the agent, parsed into `flags`.
void AddAgentFlags(CLI::App& app, AgentFlags& flags);

// After parsing: what the flags' own checks cannot see (one of --coordinator and a true
// --serve-coordinator; the coordinator's flags only with the latter; --world above
// --rank), and the fields derived from them. Returns the usage error, or "".
std::string FinishAgentFlags(const CLI::App& app, AgentFlags& flags);

}  // namespace shardsync::agent

#include "daemon/agent/agent_flags.h"

#include <climits>

#include "common/limits.h"
#include "daemon/coordinator/coordinator_flags.h"
#include "planner/schedule.h"

namespace shardsync::agent {

void AddAgentFlags(CLI::App& app, AgentFlags& c) {
  flags::AddInt(app, "--rank", c.agent.rank, "global rank of this agent (one per device)", 0, kMaxWorld - 1)
      ->required();
  app.add_option("--coordinator", c.coordinator, "the coordinator's host:port")->check(flags::kAddress);
  flags::AddSwitch(app, "--serve-coordinator", c.serve_coordinator,
                   "this agent also is the coordinator, on its --listen port (the others join it there) and on "
                   "--socket (local clients sync there: unix:PATH); its own part of every sync is a direct call, not "
                   "an RPC (one daemon for a single GPU). Takes the Coordinator flags below.");
  coordinator::AddCoordinatorFlags(app, c.coordinator_config);
  app.add_option("--socket", c.socket,
                 "unix socket for local clients (replaced if stale); beside it PATH.fds takes memory passed as "
                 "file descriptors")
      ->required();
  flags::AddAddress(app, "--listen", c.listen, "TCP address for the coordinator and peers (port 0 lets the OS choose)");
  flags::AddAddress(app, "--advertise", c.advertise,
                    "address peers and the coordinator use (default: the listen host with the bound port)");
  app.add_option("--port-file", c.port_file, "write the bound TCP port here once serving (for scripts, tests)");
  app.add_option("--device", c.device,
                 "cpu (host shared memory, the agents' gRPC channels) or a CUDA device ordinal 0..1023 (CUDA IPC "
                 "buffers, copy kernels, NCCL)")
      ->check(CLI::IsMember({"cpu"}) | (flags::kDecimal & CLI::Range(0, 1023)))
      ->capture_default_str();
  flags::AddInt<int64_t>(app, "--rpc-deadline-ms", c.rpc_deadline_ms, "deadline of every control RPC this agent makes",
                         1, 3600000);
  flags::AddInt(app, "--max-staging-bytes", c.agent.max_staging_bytes,
                "largest staging budget accepted per peer; also bounds a Transfer message", planner::kMinStagingBytes,
                int64_t{1} << 40);
  flags::AddInt(app, "--delta-snapshot-bytes", c.agent.delta_snapshot_bytes,
                "delta sync (coordinator --delta): the host memory this agent keeps of the chunks it sent, the "
                "baselines of its next deltas; a chunk past it goes whole next time",
                int64_t{0});
  flags::AddInt(app, "--max-message-bytes", c.max_message_bytes,
                "largest registration or control message accepted (the layouts of a large model)", int64_t{1} << 20,
                int64_t{INT32_MAX});
  flags::AddInt(app, "--max-registrations", c.registrations.clients,
                "registrations this agent holds at once (each holds a call open); one more is refused", 1, 65536);
  flags::AddInt(app, "--max-registrations-per-uid", c.registrations.clients_per_uid,
                "registrations from the processes of one uid at once", 1, 65536);
  flags::AddInt(app, "--max-scratch-bytes", c.registrations.scratch_bytes,
                "largest scratch this agent allocates for float8 targets, asked by the coordinator or a peer "
                "(the coordinator's --scratch-bytes must fit)",
                int64_t{0});
  app.add_option("--source-uids", c.agent.source_uids,
                 "uids whose processes may register sources (the trainer's weights), comma-separated (default: the "
                 "agent's own uid)")
      ->delimiter(',')
      ->check(flags::kDecimal);
  app.add_option("--target-uids", c.agent.target_uids,
                 "uids whose processes may register targets (the rollout's weights), comma-separated (default: the "
                 "agent's own uid)")
      ->delimiter(',')
      ->check(flags::kDecimal);
  app.add_option("--socket-group", c.socket_group,
                 "group of the unix socket (mode 0660): its members may register (default: the agent's own group)");
  app.add_option("--node", c.node,
                 "the node of this agent's device: agents of one node share fast links (NVLink), bytes between nodes "
                 "cross the network and the coordinator may relay them (default: the host name)");
  AddDaemonFlags(app, c.daemon);
  // Tests only: a deterministic stall in the middle of a sync (tests/e2e kill an agent there).
  flags::AddInt(app, "--fault-stall-at-round", c.fault_stall_at_round,
                "FOR TESTS ONLY: stall the sync (see --fault-stall-sync) that reaches this round of the transport, "
                "before it sends or receives, until the sync is aborted or its deadline; logs 'fault injection: "
                "sync ID stalls at round N' as it begins. Rounds count from 0; -2 - k is the direct path's "
                "completion message of stage k (sent after that stage's direct copies)",
                -1 - planner::kMaxStages, INT32_MAX)
      ->group("Tests only");
  flags::AddInt(app, "--fault-stall-sync", c.fault_stall_sync,
                "FOR TESTS ONLY: with --fault-stall-at-round, the n-th sync to reach that round stalls (1: the first)",
                1, INT32_MAX)
      ->group("Tests only");
}

std::string FinishAgentFlags(const CLI::App& app, AgentFlags& c) {
  if (c.coordinator.empty() == !c.serve_coordinator) {
    return "give one of --coordinator and --serve-coordinator (true)";
  }
  const char* coordinator_flags[] = {
      "--world", "--staging-bytes", "--sync-timeout-ms", "--relay",       "--direct",
      "--delta", "--link-gbps",     "--network-gbps",    "--memory-gbps", "--shared-source-uids"};
  for (const char* name : coordinator_flags) {
    if (!c.serve_coordinator && app.count(name) > 0) return std::string(name) + " goes with --serve-coordinator";
  }
  c.fault_stall = app.count("--fault-stall-at-round") > 0;
  if (app.count("--fault-stall-sync") > 0 && !c.fault_stall) {
    return "--fault-stall-sync goes with --fault-stall-at-round";
  }
  if (c.fault_stall && c.fault_stall_at_round == executor::kAgreementRound) {
    return "--fault-stall-at-round -1 is the agreement, which never stalls";
  }
  if (c.serve_coordinator && app.count("--world") == 0) return "--serve-coordinator needs --world";
  if (c.serve_coordinator && c.coordinator_config.world_size <= c.agent.rank) return "--world must be above --rank";
  c.agent.descriptor_socket = DescriptorSocketPath(c.socket);
  c.registrations.tensors = c.coordinator_config.max_tensors;  // --max-tensors: one bound, both daemons
  c.agent.rpc_deadline = absl::Milliseconds(c.rpc_deadline_ms);
  c.coordinator_config.rpc_deadline = c.agent.rpc_deadline;
  c.ordinal = c.device == "cpu" ? -1 : std::stoi(c.device);  // 0..1023 by its check
  c.agent.device = c.ordinal < 0 ? "cpu" : "cuda:" + std::to_string(c.ordinal);
  return "";
}

}  // namespace shardsync::agent

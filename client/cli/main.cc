// shardsyncctl: the operator's command line. Flags are parsed here only, into one
// typed config per command.
//   shardsyncctl sync | status | agents | explain [--coordinator ADDR] [--json]
//   shardsyncctl plan (--spec FILE | --model NAME ...) [--json]
#include <iostream>
#include <map>
#include <string>

#include "client/cli/plan_command.h"
#include "client/cli/rpc_commands.h"
#include "common/contract_id.h"
#include "common/flags.h"
#include "common/limits.h"
#include "common/tls.h"
#include "common/version.h"
#include "planner/schedule.h"

namespace {

namespace flags = shardsync::flags;

constexpr char kExitCodes[] =
    "Exit codes: 0 ok, 2 usage error, 3 refused (bad layout, a refusing agent, a missing agent; no byte moved), "
    "4 failed (a peer died or timed out, or --verify found a difference; targets are invalid), 5 the coordinator "
    "could not be reached (nothing ran).";

void AddPlanFlags(CLI::App& plan, shardsync::cli::PlanCommandConfig& config) {
  CLI::Option* spec = plan.add_option("--spec", config.spec_path,
                                      "a layout spec: JSON of shardsync.v1.LayoutSpec (docs/layout-spec.md)");
  CLI::Option* model = plan.add_option("--model", config.model,
                                       "a preset model: qwen3-0.6b, qwen3-1.7b, qwen3-8b; or a mixture of experts "
                                       "(planner/moe_layout.h): kimi-k2-sized, qwen3-235b-sized, glm-4.5-sized");
  spec->excludes(model);
  flags::AddInt(plan, "--zero", config.zero_stage, "with --model: trainer ZeRO stage", 1, 3);
  flags::AddInt(plan, "--dp", config.dp, "with --model: trainer DP ranks 0..N-1", 1, shardsync::kMaxWorld);
  flags::AddInt(plan, "--tp", config.tp, "with --model: rollout TP size of each replica", 1, shardsync::kMaxWorld);
  flags::AddInt(plan, "--replicas", config.replicas, "with --model: rollout replicas on ranks R..R+tp*replicas-1", 1,
                shardsync::kMaxWorld);
  flags::AddInt(plan, "--rollout-rank", config.rollout_rank,
                "with --model: the rollout's first rank, R above (0: beside the trainer)", 0, shardsync::kMaxWorld - 1);
  flags::AddSwitch(plan, "--fused", config.fused, "with --model: the rollout holds fused qkv and gate_up shards");
  flags::AddInt(plan, "--ep", config.ep,
                "with a mixture of experts: the trainer's expert parallelism, its ranks EP x DP (experts ZeRO-3 "
                "within each EP rank's DP group, the rest over all)",
                1, shardsync::kMaxWorld);
  flags::AddInt(plan, "--rollout-ep", config.rollout_ep,
                "with a mixture of experts: each replica's expert parallelism, its ranks EP x TP", 1,
                shardsync::kMaxWorld);
  flags::AddInt(plan, "--layers", config.layers, "with a mixture of experts: its first N layers (0: all)", 0, 1 << 20);
  flags::AddInt(plan, "--staging-bytes", config.staging_bytes, "staging budget per peer, both directions, bytes",
                shardsync::planner::kMinStagingBytes);
  flags::AddPositive(plan, "--link-gbps", config.link_gbps, "link speed for the floor, GB/s one direction per rank");
  flags::AddPositive(plan, "--memory-gbps", config.memory_gbps, "device memory speed for the floor, GB/s read + write");
  flags::AddInt(plan, "--ranks-per-node", config.ranks_per_node,
                "ranks r and s share a node when r/K == s/K (0: one node); bytes between nodes count at the "
                "network's speed",
                0, shardsync::kMaxWorld);
  flags::AddPositive(plan, "--network-gbps", config.network_gbps,
                     "network speed between nodes, GB/s one direction per rank");
  const std::map<std::string, shardsync::planner::RelayMode> relay_modes{
      {"auto", shardsync::planner::RelayMode::kAuto},
      {"always", shardsync::planner::RelayMode::kAlways},
      {"never", shardsync::planner::RelayMode::kNever}};
  plan.add_option("--relay", config.relay, "auto (relay when its floor is lower), always, never")
      ->transform(CLI::CheckedTransformer(relay_modes))
      ->default_str("auto");
  plan.add_option("--policy", config.policy, "replica policy")
      ->check(CLI::IsMember({"least_loaded", "first_holder"}))
      ->capture_default_str();
  flags::AddSwitch(plan, "--json", config.json, "the report as JSON (proto field names, as explain --json)");
  flags::AddSwitch(plan, "--links", config.links, "every link's bytes too");
}

// The flags of the commands that call the coordinator; `command` is one of them.
void AddRpcFlags(CLI::App& command, shardsync::cli::RpcCommandConfig& config, shardsync::TlsConfig& tls) {
  const std::string name = command.get_name();
  flags::AddCoordinatorAddress(command, "--coordinator", config.coordinator,
                               "the coordinator's host:port, or unix:PATH (an agent serving it; with --insecure)");
  flags::AddInt<int64_t>(command, "--timeout-ms", config.timeout_ms,
                         "deadline of the call; for sync the sync's, when smaller than the coordinator's "
                         "--sync-timeout-ms (default: the coordinator's; other calls 30 s)",
                         0, 86400000);
  flags::AddSwitch(command, "--json", config.json, "the response as JSON (proto field names)");
  shardsync::AddTlsFlags(command, tls);
  if (name == "sync" || name == "explain") {
    command
        .add_option("--target-ranks", config.target_ranks,
                    "only the targets on these ranks (a rank whose inference engine restarted, or that status "
                    "calls invalid); every other target keeps its bytes")
        ->delimiter(',')
        ->check(flags::kDecimal);
  }
  if (name == "sync") {
    flags::AddSwitch(command, "--watch", config.watch, "live progress per rank every 100 ms");
    flags::AddSwitch(command, "--verify", config.verify,
                     "afterwards every agent checksums each target placement and the source bytes it came from; any "
                     "difference fails the sync (exit 4) naming tensor and rank");
    flags::AddSwitch(command, "--links", config.links,
                     "every link's bytes too (up to ranks x ranks of them; without it a sync reports per rank only)");
  }
  if (name == "explain") {
    flags::AddSwitch(command, "--links", config.links, "every link's bytes and path too");
    const std::string of_coordinator = " (default: the coordinator's cost model)";
    command
        .add_option("--link-gbps", config.link_gbps,
                    "link speed within a node, GB/s one direction per rank" + of_coordinator)
        ->check(flags::kPositive);
    command.add_option("--memory-gbps", config.memory_gbps, "memory speed, GB/s read + write" + of_coordinator)
        ->check(flags::kPositive);
    command
        .add_option("--network-gbps", config.network_gbps,
                    "network speed between nodes, GB/s one direction per rank" + of_coordinator)
        ->check(flags::kPositive);
  }
  command.footer(kExitCodes);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("The operator's command line of shardsync.", "shardsyncctl");
  app.require_subcommand(1);
  app.footer(std::string(kExitCodes) + "\nRun `shardsyncctl COMMAND --help` for a command's flags.");

  shardsync::cli::PlanCommandConfig plan_config;
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Plan a layout offline (no daemons), as the coordinator would; print the report explain prints: per "
      "rank the bytes sent, received, copied locally and zero-filled, chunks and rounds, the digest and the "
      "floor.");
  AddPlanFlags(*plan, plan_config);

  shardsync::cli::RpcCommandConfig rpc_config;
  shardsync::TlsConfig tls;
  const std::map<std::string, std::string> rpc_commands{
      {"sync",
       "Run one sync through the coordinator: Prepare everywhere, Execute only if every agent agreed; "
       "print per rank the bytes sent, received and copied locally, rounds, chunks, peak staging, "
       "seconds and GB/s."},
      {"status", "Agents, layout epoch and the last sync, as the coordinator sees them; whether targets are valid."},
      {"agents",
       "One line per agent: rank, address, host, device, joined or silent, seconds since its last "
       "heartbeat, clients registered; and who has not joined. With --json, the coordinator's whole status (as "
       "status --json)."},
      {"explain",
       "The plan of the current layouts: bytes per rank, the imbalance and the cost floor; with "
       "--links, the bytes of every link. Nothing is moved."}};
  for (const auto& [name, description] : rpc_commands)
    AddRpcFlags(*app.add_subcommand(name, description), rpc_config, tls);

  bool version_json = false;
  CLI::App* version = app.add_subcommand("version", "This build's version and contract id (the daemons' must match).");
  flags::AddSwitch(*version, "--json", version_json, "as JSON");

  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  const std::string command = app.get_subcommands().front()->get_name();
  if (command == "version") {
    if (version_json) {
      std::cout << "{\"version\": \"" << shardsync::kVersion << "\", \"api\": \"shardsync.v1\", \"contract\": \""
                << shardsync::kContractId << "\"}\n";
    } else {
      std::cout << "shardsyncctl " << shardsync::kVersion << " (API shardsync.v1, contract " << shardsync::kContractId
                << ")\n";
    }
    return 0;
  }
  if (command == "plan") {
    if (plan_config.spec_path.empty() == plan_config.model.empty()) {
      return flags::UsageError(*plan, "give exactly one of --spec and --model");
    }
    return shardsync::cli::RunPlanCommand(plan_config, std::cout, std::cerr);
  }
  for (int32_t rank : rpc_config.target_ranks) {
    if (rank < 0) return flags::UsageError(app, "--target-ranks takes ranks separated by commas, like 1,3");
  }
  const absl::StatusOr<shardsync::Credentials> credentials = shardsync::LoadCredentials(tls);
  if (!credentials.ok()) return flags::UsageError(app, std::string(credentials.status().message()));
  rpc_config.credentials = *credentials;
  if (command == "sync") return shardsync::cli::RunSyncCommand(rpc_config, std::cout, std::cerr);
  if (command == "status") return shardsync::cli::RunStatusCommand(rpc_config, std::cout, std::cerr);
  if (command == "agents") return shardsync::cli::RunAgentsCommand(rpc_config, std::cout, std::cerr);
  return shardsync::cli::RunExplainCommand(rpc_config, std::cout, std::cerr);
}

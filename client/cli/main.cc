// shardsyncctl: the operator's command line. Flags are parsed here only, into one
// typed config per command.
//   shardsyncctl sync | status | explain [--coordinator ADDR] [--json]
//   shardsyncctl plan [--spec FILE | --model NAME ...] [--json]
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/cli/plan_command.h"
#include "client/cli/rpc_commands.h"
#include "common/flags.h"
#include "common/tls.h"
#include "common/version.h"
#include "planner/models.h"

namespace {

constexpr char kUsage[] = R"(usage: shardsyncctl COMMAND [FLAGS]

Commands:
  sync      Run one sync through the coordinator; print bytes, rounds and time per rank.
  status    Agents, layout epoch and the last sync, as the coordinator sees them.
  agents    The agents: rank, address, host, device, state, last seen, clients.
  explain   The current plan's bytes per rank (and link), imbalance and floor; moves nothing.
  plan      Plan a layout spec offline (no daemons); print bytes per rank and the floor.
  version   This build's version (--json: as JSON).

Exit codes: 0 ok, 2 usage error, 3 refused (bad layout or input).
Run `shardsyncctl COMMAND --help` for a command's flags.
)";

constexpr char kPlanHelp[] = R"(usage: shardsyncctl plan (--spec FILE | --model NAME [model flags]) [FLAGS]

Plans every tensor of a layout once, as the coordinator would, and prints per rank the
bytes sent, received, copied locally and zero-filled, the segments, chunks and rounds,
the plan digest and the cost floor. Nothing is moved.

Layout (one of):
  --spec FILE           a layout spec: JSON of shardsync.v1.LayoutSpec (docs/layout-spec.md)
  --model NAME          a preset model: qwen3-0.6b, qwen3-1.7b, qwen3-8b
Model flags (with --model):
  --zero N              trainer ZeRO stage: 1, 2 or 3 (default 3)
  --dp N                trainer DP ranks 0..N-1 (default 8)
  --tp N                rollout TP size of each replica (default 4)
  --replicas N          rollout replicas on ranks R..R+tp*replicas-1 (default 2)
  --rollout-rank R      the rollout's first rank, R above (default 0: beside the trainer)
  --fused               rollout holds fused qkv and gate_up shards
Flags:
  --staging-bytes B     staging budget per peer, both directions, bytes (default 134217728)
  --link-gbps X         link speed for the floor, GB/s one direction per rank (default 360)
  --memory-gbps X       device memory speed for the floor, GB/s read + write (default 4200)
  --ranks-per-node K    ranks r and s share a node when r/K == s/K (default 0: one node);
                        bytes between nodes count at the network's speed
  --network-gbps X      network speed between nodes, GB/s one direction per rank (default 50)
  --relay MODE          auto (default: relay when its floor is lower), always, never
  --policy P            replica policy: least_loaded (default) or first_holder
  --json                one JSON object instead of tables
)";

constexpr char kRpcHelp[] = R"(usage: shardsyncctl (sync | status | agents | explain) [FLAGS]

  sync      Plans (once per layout epoch) and runs one sync on every agent: Prepare
            everywhere, Execute only if every agent agreed. Waits for the end and
            prints per rank the bytes sent, received and copied locally, rounds,
            chunks, peak staging, seconds and effective GB/s. With --watch, prints
            every rank's bytes and rounds done every 100 ms while it runs.
  status    The agents (rank, address, host, device, state, clients), the layout
            epoch, the last sync and whether the targets are valid.
  agents    One line per agent: rank, address, host, device, joined or silent, seconds
            since its last heartbeat, clients registered; and who has not joined.
  explain   The plan of the current layouts: bytes per rank, the imbalance (busiest
            rank's link bytes over the mean) and the cost floor at the given speeds;
            with --layout, the bytes of every link too. Nothing is moved.

Flags:
  --coordinator ADDR    the coordinator's host:port (default 127.0.0.1:7070)
  --timeout-ms N        deadline of the call; for sync also the sync's (default 60000)
  --link-gbps X         explain: link speed within a node, GB/s one direction per rank
  --memory-gbps X       explain: memory speed, GB/s read + write
  --network-gbps X      explain: network speed between nodes, GB/s one direction per
                        rank (each default: the coordinator's cost model)
  --json                the response as JSON (proto field names)
  --watch               sync: live progress per rank
  --verify              sync: afterwards every agent checksums each target placement
                        and the source bytes it came from; any difference fails the
                        sync (exit 4) naming tensor and rank
  --target-ranks R,R    sync, explain: only the targets on these ranks (a rank whose
                        inference engine restarted, or that status calls invalid);
                        every other target keeps its bytes
  --layout              explain: bytes per link
TCP security, as the coordinator has it (one of them required):

Exit codes: 0 ok, 2 usage error, 3 refused (bad layout, a refusing agent, a missing
agent; no byte moved), 4 failed (a peer died or timed out, or --verify found a
difference; targets are invalid).
)";

std::string RpcHelp() {
  const std::string help = kRpcHelp;
  const size_t split = help.find("\nExit codes");
  return help.substr(0, split) + shardsync::kTlsHelp + help.substr(split);
}

int Usage(const std::string& error, const char* help) {
  std::cerr << "shardsyncctl: " << error << "\n\n" << help;
  return 2;
}

int Plan(shardsync::Flags& flags) {
  if (flags.TakeSwitch("help")) {
    std::cout << kPlanHelp;
    return 0;
  }
  shardsync::cli::PlanCommandConfig config;
  config.spec_path = flags.Take("spec", "");
  config.model = flags.Take("model", "");
  config.fused = flags.TakeSwitch("fused");
  config.zero_stage = flags.TakeNumber("zero", config.zero_stage);
  config.dp = flags.TakeNumber("dp", config.dp);
  config.tp = flags.TakeNumber("tp", config.tp);
  config.replicas = flags.TakeNumber("replicas", config.replicas);
  config.rollout_rank = flags.TakeNumber("rollout-rank", config.rollout_rank);
  config.staging_bytes = flags.TakeNumber("staging-bytes", config.staging_bytes);
  config.link_gbps = flags.TakeNumber("link-gbps", config.link_gbps);
  config.memory_gbps = flags.TakeNumber("memory-gbps", config.memory_gbps);
  config.network_gbps = flags.TakeNumber("network-gbps", config.network_gbps);
  config.ranks_per_node = flags.TakeNumber("ranks-per-node", config.ranks_per_node);
  const absl::StatusOr<shardsync::planner::RelayMode> relay = shardsync::planner::ParseRelayMode(flags.Take("relay", "auto"));
  config.policy = flags.Take("policy", config.policy);
  config.json = flags.TakeSwitch("json");
  if (!flags.error().empty()) return Usage(flags.error(), kPlanHelp);
  if (!flags.Leftover().empty()) return Usage(flags.Leftover(), kPlanHelp);
  if (config.spec_path.empty() == config.model.empty()) return Usage("give exactly one of --spec and --model", kPlanHelp);
  if (config.policy != "least_loaded" && config.policy != "first_holder") {
    return Usage("--policy must be least_loaded or first_holder", kPlanHelp);
  }
  if (config.dp < 1 || config.tp < 1 || config.replicas < 1 || config.link_gbps <= 0 || config.memory_gbps <= 0 ||
      config.network_gbps <= 0 || config.rollout_rank < 0 || config.ranks_per_node < 0) {
    return Usage("--dp, --tp, --replicas and the speeds must be positive, --rollout-rank and --ranks-per-node not "
                 "negative", kPlanHelp);
  }
  if (!relay.ok()) return Usage(std::string(relay.status().message()), kPlanHelp);
  config.relay = *relay;
  return shardsync::cli::RunPlanCommand(config, std::cout, std::cerr);
}

int Rpc(const std::string& command, shardsync::Flags& flags) {
  const std::string help = RpcHelp();
  if (flags.TakeSwitch("help")) {
    std::cout << help;
    return 0;
  }
  shardsync::cli::RpcCommandConfig config;
  config.coordinator = flags.Take("coordinator", config.coordinator);
  const shardsync::TlsConfig tls = shardsync::TakeTlsFlags(flags);
  config.timeout_ms = flags.TakeNumber("timeout-ms", config.timeout_ms);
  config.link_gbps = flags.TakeNumber("link-gbps", config.link_gbps);
  config.memory_gbps = flags.TakeNumber("memory-gbps", config.memory_gbps);
  config.network_gbps = flags.TakeNumber("network-gbps", config.network_gbps);
  config.json = flags.TakeSwitch("json");
  config.watch = flags.TakeSwitch("watch");
  config.verify = flags.TakeSwitch("verify");
  config.layout = flags.TakeSwitch("layout");
  const std::string target_ranks = flags.Take("target-ranks", "");
  for (absl::string_view rank : absl::StrSplit(target_ranks, ',', absl::SkipEmpty())) {
    int32_t parsed = -1;
    if (!absl::SimpleAtoi(rank, &parsed) || parsed < 0) {
      return Usage("--target-ranks takes ranks separated by commas, like 1,3", help.c_str());
    }
    config.target_ranks.push_back(parsed);
  }
  if (!flags.error().empty()) return Usage(flags.error(), help.c_str());
  if (!flags.Leftover().empty()) return Usage(flags.Leftover(), help.c_str());
  if (((config.watch || config.verify) && command != "sync") || (config.layout && command != "explain")) {
    return Usage("--watch and --verify go with sync, --layout with explain", help.c_str());
  }
  if (!config.target_ranks.empty() && command != "sync" && command != "explain") {
    return Usage("--target-ranks goes with sync and explain", help.c_str());
  }
  if (config.timeout_ms <= 0 || config.link_gbps < 0 || config.memory_gbps < 0 || config.network_gbps < 0) {
    return Usage("--timeout-ms must be positive and the speeds not negative", help.c_str());
  }
  const absl::StatusOr<shardsync::Credentials> credentials = shardsync::LoadCredentials(tls);
  if (!credentials.ok()) return Usage(std::string(credentials.status().message()), help.c_str());
  config.credentials = *credentials;
  if (command == "sync") return shardsync::cli::RunSyncCommand(config, std::cout, std::cerr);
  if (command == "status") return shardsync::cli::RunStatusCommand(config, std::cout, std::cerr);
  if (command == "agents") return shardsync::cli::RunAgentsCommand(config, std::cout, std::cerr);
  return shardsync::cli::RunExplainCommand(config, std::cout, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  shardsync::Flags flags(argc, argv, 2);
  if (!flags.error().empty()) return Usage(flags.error(), kUsage);
  if (command == "plan") return Plan(flags);
  if (command == "sync" || command == "status" || command == "agents" || command == "explain") {
    return Rpc(command, flags);
  }
  if (command == "version") {
    const bool json = flags.TakeSwitch("json");
    if (!flags.Leftover().empty()) return Usage(flags.Leftover(), kUsage);
    if (json) {
      std::cout << "{\"version\": \"" << shardsync::kVersion << "\", \"api\": \"shardsync.v1\"}\n";
    } else {
      std::cout << "shardsyncctl " << shardsync::kVersion << " (API shardsync.v1)\n";
    }
    return 0;
  }
  return Usage("unknown command '" + command + "'", kUsage);
}

// The main job on one machine: starts a coordinator and one agent per rank, a synthetic
// trainer (ZeRO sources) and rollout (TP arena) client per rank as real processes,
// syncs, verifies every target byte, prints the stats table, stops everything it
// started, and ends with one JSON line.
//   bazel run -c opt //tools/localsync:local_sync -- [--model qwen3-0.6b] [--agents 4]
//       [--zero 3] [--tp 2] [--replicas 2] [--syncs 2] [--staging-bytes B]
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/cli/sync_table.h"
#include "common/flags.h"
#include "planner/schedule.h"
#include "tools/localsync/deployment.h"

namespace {

int Fail(const std::string& why) {
  std::cout << "{\"status\": \"failed\", \"error\": \"" << absl::StrJoin(absl::StrSplit(why, '"'), "'") << "\"}"
            << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardsync;
  std::string model = "qwen3-0.6b";
  localsync::ClusterOptions options;
  options.agents = 4;
  options.staging_bytes = int64_t{8} << 20;
  options.sync_timeout_ms = 600000;
  int zero = 3, tp = 2, replicas = 2, syncs = 2;
  CLI::App app(
      "A whole shardsync on this machine: a coordinator, agents, trainer and rollout clients; syncs a "
      "preset model's shapes and checks every target byte.",
      "local_sync");
  app.add_option("--model", model, "preset model")
      ->check(CLI::IsMember({"qwen3-0.6b", "qwen3-1.7b", "qwen3-8b"}))
      ->capture_default_str();
  flags::AddInt(app, "--agents", options.agents, "agents (ranks 0..N-1), every one a trainer DP rank", 1, 64);
  flags::AddInt(app, "--zero", zero, "trainer ZeRO stage", 1, 3);
  flags::AddInt(app, "--tp", tp, "rollout TP size", 1, 64);
  flags::AddInt(app, "--replicas", replicas, "rollout replicas on ranks 0..tp*replicas-1", 1, 64);
  flags::AddInt(app, "--syncs", syncs, "syncs, with new source values before each", 1, 1000);
  flags::AddInt(app, "--staging-bytes", options.staging_bytes, "staging per peer, both directions",
                planner::kMinStagingBytes);
  double changed = 1.0;
  app.add_option("--changed", changed,
                 "fraction of the source elements the trainer changes between syncs (the same ones each time)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--delta", options.delta,
                 "the coordinator's --delta: off, auto or always; on, every link is staged (--direct never), as "
                 "between hosts")
      ->check(CLI::IsMember({"off", "auto", "always"}));
  bool verify = false;
  flags::AddSwitch(app, "--verify", verify,
                   "every sync compares each target placement's checksum with its sources' (sync --verify)");
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  if (!options.delta.empty() && options.delta != "off") options.direct = "never";
  if (tp * replicas > options.agents) return flags::UsageError(app, "tp * replicas exceeds the agents");
  std::vector<std::string> dp, groups;
  for (int r = 0; r < options.agents; ++r) dp.push_back(std::to_string(r));
  for (int k = 0; k < replicas; ++k) {
    std::vector<std::string> ranks;
    for (int t = 0; t < tp; ++t) ranks.push_back(std::to_string(k * tp + t));
    groups.push_back(absl::StrCat("{\"ranks\": [", absl::StrJoin(ranks, ", "), "]}"));
  }
  const std::string spec =
      absl::StrCat("{\"model\": {\"preset\": \"", model, "\", \"zero_stage\": ", zero, ", \"dp_ranks\": [",
                   absl::StrJoin(dp, ", "), "], \"replicas\": [", absl::StrJoin(groups, ", "), "]}}");
  std::cerr << "local_sync: " << model << ", ZeRO-" << zero << " over " << options.agents << " ranks into " << replicas
            << " TP=" << tp << " replicas\n";
  try {
    localsync::Cluster cluster(options);
    localsync::Deployment deployment(cluster, "local", spec, /*seed=*/1);
    deployment.SetChanged(changed);
    for (const std::string& line : deployment.WaitReady()) {
      if (line.rfind("ready", 0) != 0) return Fail("a client did not register: " + line);
    }
    int64_t bytes = 0, mismatched = 0, wire_bytes = 0, full_bytes = 0;
    double seconds = 0;
    for (int i = 1; i <= syncs; ++i) {
      if (i > 1) deployment.Refill(i);
      auto response = localsync::SyncOnce(cluster, absl::Minutes(10), verify);
      if (!response.ok()) {
        cluster.DumpLogs();
        return Fail(std::string(response.status().message()));
      }
      cli::PrintSyncTable(*response, std::cout);
      const int64_t wrong = deployment.MismatchedBytes(i);
      std::cout << "verified: " << wrong << " of the targets' bytes differ from the sources\n\n";
      mismatched += wrong;
      bytes = wire_bytes = full_bytes = 0;
      for (const v1::RankStats& r : response->ranks()) {
        bytes += r.received_bytes() + r.local_bytes();
        wire_bytes += r.wire_bytes();                          // between agents, through the transport
        full_bytes += r.sent_bytes() - r.direct_sent_bytes();  // the same chunks whole
      }
      seconds = response->seconds();
    }
    std::cout << "{\"status\": \"" << (mismatched == 0 ? "ok" : "mismatch")
              << "\", \"tensors\": " << deployment.input().tensors.size() << ", \"bytes\": " << bytes
              << ", \"seconds\": " << seconds << ", \"syncs\": " << syncs << ", \"mismatched\": " << mismatched
              << ", \"wire_bytes\": " << wire_bytes << ", \"full_bytes\": " << full_bytes << "}" << std::endl;
    return mismatched == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}

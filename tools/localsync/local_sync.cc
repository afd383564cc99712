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
#include "tools/localsync/deployment.h"

namespace {

constexpr char kHelp[] = R"(usage: local_sync [FLAGS]

  --model NAME        preset model: qwen3-0.6b (default), qwen3-1.7b, qwen3-8b
  --agents N          agents (ranks 0..N-1), every one a trainer DP rank (default 4)
  --zero N            trainer ZeRO stage 1, 2 or 3 (default 3)
  --tp N              rollout TP size (default 2)
  --replicas N        rollout replicas on ranks 0..tp*replicas-1 (default 2)
  --syncs N           syncs, with new source values before each (default 2)
  --staging-bytes B   staging per peer, both directions (default 8388608)
)";

int Fail(const std::string& why) {
  std::cout << "{\"status\": \"failed\", \"error\": \"" << absl::StrJoin(absl::StrSplit(why, '"'), "'") << "\"}"
            << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardsync;
  Flags flags(argc, argv, 1);
  if (flags.TakeSwitch("help")) {
    std::cout << kHelp;
    return 0;
  }
  const std::string model = flags.Take("model", "qwen3-0.6b");
  localsync::ClusterOptions options;
  options.agents = flags.TakeNumber("agents", 4);
  const int zero = flags.TakeNumber("zero", 3);
  const int tp = flags.TakeNumber("tp", 2);
  const int replicas = flags.TakeNumber("replicas", 2);
  const int syncs = flags.TakeNumber("syncs", 2);
  options.staging_bytes = flags.TakeNumber("staging-bytes", int64_t{8} << 20);
  options.sync_timeout_ms = 600000;
  if (!flags.error().empty() || !flags.Leftover().empty() || tp * replicas > options.agents || syncs < 1) {
    std::cerr << "local_sync: " << flags.error() << flags.Leftover()
              << (tp * replicas > options.agents ? "tp * replicas exceeds the agents" : "") << "\n\n"
              << kHelp;
    return 2;
  }
  std::vector<std::string> dp, groups;
  for (int r = 0; r < options.agents; ++r) dp.push_back(std::to_string(r));
  for (int k = 0; k < replicas; ++k) {
    std::vector<std::string> ranks;
    for (int t = 0; t < tp; ++t) ranks.push_back(std::to_string(k * tp + t));
    groups.push_back(absl::StrCat("{\"ranks\": [", absl::StrJoin(ranks, ", "), "]}"));
  }
  const std::string spec = absl::StrCat("{\"model\": {\"preset\": \"", model, "\", \"zero_stage\": ", zero,
                                        ", \"dp_ranks\": [", absl::StrJoin(dp, ", "), "], \"replicas\": [",
                                        absl::StrJoin(groups, ", "), "]}}");
  std::cerr << "local_sync: " << model << ", ZeRO-" << zero << " over " << options.agents << " ranks into "
            << replicas << " TP=" << tp << " replicas\n";
  try {
    localsync::Cluster cluster(options);
    localsync::Deployment deployment(cluster, "local", spec, /*seed=*/1);
    for (const std::string& line : deployment.WaitReady()) {
      if (line.rfind("ready", 0) != 0) return Fail("a client did not register: " + line);
    }
    int64_t bytes = 0, mismatched = 0;
    double seconds = 0;
    for (int i = 1; i <= syncs; ++i) {
      if (i > 1) deployment.Refill(i);
      auto response = localsync::SyncOnce(cluster, absl::Minutes(10));
      if (!response.ok()) {
        cluster.DumpLogs();
        return Fail(std::string(response.status().message()));
      }
      cli::PrintSyncTable(*response, std::cout);
      const int64_t wrong = deployment.MismatchedBytes(i);
      std::cout << "verified: " << wrong << " of the targets' bytes differ from the sources\n\n";
      mismatched += wrong;
      bytes = 0;
      for (const v1::RankStats& r : response->ranks()) bytes += r.received_bytes() + r.local_bytes();
      seconds = response->seconds();
    }
    std::cout << "{\"status\": \"" << (mismatched == 0 ? "ok" : "mismatch") << "\", \"tensors\": "
              << deployment.input().tensors.size() << ", \"bytes\": " << bytes << ", \"seconds\": " << seconds
              << ", \"syncs\": " << syncs << ", \"mismatched\": " << mismatched << "}" << std::endl;
    return mismatched == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
}

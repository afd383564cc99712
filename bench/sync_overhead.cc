// The control plane alone: a coordinator and N agents on this machine, each rank's
// trainer and rollout registering a tensor with nothing to move (zero elements), then
// many syncs timed from the client. Prints one JSON line: the client's median, p99 and
// minimum milliseconds, the medians of where a sync went as the coordinator timed it
// (its whole sync, the Prepare and Execute fan-outs), and the CPU time per sync of the
// daemons and of the client (/proc), steadier than wall time on a busy machine.
//   bazel build -c opt //bench:sync_overhead && cd bazel-bin/bench/sync_overhead.runfiles/shardsync &&
//   ../../sync_overhead [--agents 8] [--syncs 200] [--agent0-serves-coordinator]
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "tools/localsync/deployment.h"

namespace {

// CPU time (user and system) process `pid` has spent, from /proc/PID/stat; 0 if unreadable.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command, which is in parentheses and may hold spaces: state is the
  // 3rd field, utime the 14th and stime the 15th.
  std::istringstream fields(line.substr(line.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int k = 3; k <= 15 && fields >> field; ++k) {
    if (k >= 14) ticks += std::stod(field);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The CPU time of the daemons (agents, and the coordinator when it is a process of its own)
// and of this process (the client), in seconds.
std::pair<double, double> CpuSeconds(shardsync::localsync::Cluster& cluster, int agents, bool own_coordinator) {
  double daemons = own_coordinator ? ProcessCpuSeconds(cluster.coordinator_process().pid()) : 0;
  for (int r = 0; r < agents; ++r) daemons += ProcessCpuSeconds(cluster.agent(r).pid());
  return {daemons, ProcessCpuSeconds(getpid())};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardsync;
  localsync::ClusterOptions options;
  options.agents = 8;
  int syncs = 200;
  CLI::App app("A sync's round trip with no bytes to move, through real daemons.", "sync_overhead");
  flags::AddInt(app, "--agents", options.agents, "agents", 1, 256);
  flags::AddInt(app, "--syncs", syncs, "syncs to time", 1);
  flags::AddSwitch(app, "--agent0-serves-coordinator", options.agent0_serves_coordinator,
                   "agent 0 is the coordinator too");
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  std::vector<std::string> ranks;
  for (int r = 0; r < options.agents; ++r) ranks.push_back(std::to_string(r));
  // One zero-element tensor, replicated on every rank on both sides: every rank
  // registers it, every agent is prepared and executes, and no byte moves.
  const std::string spec =
      absl::StrCat(R"({"model": {"tensors": [{"name": "empty", "shape": [0, 8]}], "zero_stage": 1, "dp_ranks": [)",
                   absl::StrJoin(ranks, ", "), R"(], "replicas": [{"ranks": [)", absl::StrJoin(ranks, ", "), "]}]}}");
  localsync::Cluster cluster(options);
  localsync::Deployment deployment(cluster, "overhead", spec, 1);
  for (const std::string& line : deployment.WaitReady()) {
    if (line.rfind("ready", 0) != 0) {
      std::fprintf(stderr, "a client did not register: %s\n", line.c_str());
      return 1;
    }
  }
  // One client for all syncs, as a trainer keeps one: its channel is connected once.
  client::CoordinatorClient coordinator = cluster.coordinator_client();
  std::vector<double> ms, coordinator_ms, prepare_ms, execute_ms;
  // Of the slowest rank each sync: its Execute in the agent, and of it the checks and
  // the agreement.
  std::vector<double> agent_ms, check_ms, agree_ms;
  std::pair<double, double> cpu_before;
  for (int i = 0; i < syncs + 1; ++i) {
    if (i == 1) cpu_before = CpuSeconds(cluster, options.agents, !options.agent0_serves_coordinator);
    const absl::Time start = absl::Now();
    auto response = coordinator.Sync(absl::Seconds(10));
    if (!response.ok()) {
      std::fprintf(stderr, "sync failed: %s\n", std::string(response.status().message()).c_str());
      return 1;
    }
    if (i == 0) continue;  // the first plans
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    coordinator_ms.push_back(response->seconds() * 1e3);
    prepare_ms.push_back(response->prepare_seconds() * 1e3);
    execute_ms.push_back(response->execute_seconds() * 1e3);
    double agent = 0, check = 0, agree = 0;
    for (const v1::RankStats& rank : response->ranks()) {
      agent = std::max(agent, rank.execute_seconds() * 1e3);
      check = std::max(check, rank.check_seconds() * 1e3);
      agree = std::max(agree, rank.agree_seconds() * 1e3);
    }
    agent_ms.push_back(agent);
    check_ms.push_back(check);
    agree_ms.push_back(agree);
  }
  const std::pair<double, double> cpu_after = CpuSeconds(cluster, options.agents, !options.agent0_serves_coordinator);
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::sort(ms.begin(), ms.end());
  std::printf(
      "{\"agents\": %d, \"agent0_serves_coordinator\": %s, \"syncs\": %d, \"median_ms\": %.3f, "
      "\"p99_ms\": %.3f, \"min_ms\": %.3f, \"coordinator_median_ms\": %.3f, \"prepare_median_ms\": %.3f, "
      "\"execute_median_ms\": %.3f, \"agent_execute_median_ms\": %.3f, \"check_median_ms\": %.3f, "
      "\"agree_median_ms\": %.3f, \"daemons_cpu_ms_per_sync\": %.3f, \"client_cpu_ms_per_sync\": %.3f}\n",
      options.agents, options.agent0_serves_coordinator ? "true" : "false", syncs, ms[ms.size() / 2],
      ms[ms.size() * 99 / 100], ms.front(), median(coordinator_ms), median(prepare_ms), median(execute_ms),
      median(agent_ms), median(check_ms), median(agree_ms), (cpu_after.first - cpu_before.first) * 1e3 / syncs,
      (cpu_after.second - cpu_before.second) * 1e3 / syncs);
  return 0;
}

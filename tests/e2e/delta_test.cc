// Delta sync through real daemons and client processes (CPU): a trainer changing 1% of
// its elements puts a few percent of the bytes on the wire; after an agent is killed,
// during a sync or between two, the next sync sends whole what the fault touched and
// says why, deltas resume after it, and every sync is exact.
#include <signal.h>

#include <catch2/catch.hpp>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli/sync_table.h"
#include "planner/schedule.h"
#include "tests/e2e/small_model.h"
#include "tools/localsync/deployment.h"
#include "tools/localsync/http_get.h"

namespace shardsync::localsync {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("delta sync: a trainer changing 1% of its elements puts a few percent of the bytes on the wire, exact") {
  ClusterOptions options;
  options.delta = "always";
  options.direct = "never";  // every link staged, as between hosts
  options.staging_bytes = 1 << 16;
  Cluster cluster(options);
  Deployment deployment(cluster, "delta", ModelJson(3, kLayouts[1].replicas), 81);
  RequireReady(deployment);
  deployment.SetChanged(0.01);
  for (uint64_t seed = 81; seed <= 84; ++seed) {
    INFO("seed " << seed);
    if (seed > 81) deployment.Refill(seed);
    auto sync = SyncOnce(cluster, absl::Seconds(30), /*verify=*/seed == 84);
    if (!sync.ok()) cluster.DumpLogs();
    REQUIRE(sync.ok());
    CHECK(deployment.CheckTargets(seed).empty());
    int64_t wire = 0, full = 0, deltas = 0;
    for (const v1::RankStats& r : sync->ranks()) {
      wire += r.wire_bytes();
      full += r.staged_sent_bytes();
      deltas += r.delta_chunks();
    }
    INFO(wire << " of " << full << " bytes on the wire, " << deltas << " chunks as deltas");
    REQUIRE(full > 0);
    std::ostringstream table;
    cli::PrintSyncTable(*sync, table);
    if (seed == 81) {
      CHECK(wire == full);  // nothing kept to diff against yet
      CHECK(deltas == 0);
      CHECK_THAT(table.str(), Contains("chunks sent whole: ") && Contains(" new_target\n"));
    } else {
      CHECK(deltas > 0);
      CHECK(wire * 10 < full);
      CHECK_THAT(table.str(), Contains(absl::StrCat(deltas, " chunks as deltas")));
    }
    // Links were not asked for: none, and no rank's per-peer wire either.
    CHECK(sync->links_size() == 0);
    for (const v1::RankStats& r : sync->ranks()) CHECK(r.peer_wire_size() == 0);
  }
  // A rollout that restarted registers new memory with the same layout (the plan keeps
  // its digest): chunks into its rank go whole, as new targets; the other ranks keep
  // getting deltas; the sync after, every rank does.
  REQUIRE_THAT(deployment.RestartRollout(3), Catch::Matchers::StartsWith("ready"));
  v1::SyncRequest with_links;
  with_links.set_links(true);
  for (uint64_t seed = 85; seed <= 86; ++seed) {
    deployment.Refill(seed);
    auto sync = SyncOnce(cluster, with_links, absl::Seconds(30));
    REQUIRE(sync.ok());
    CHECK(deployment.CheckTargets(seed).empty());
    std::map<std::string, int64_t> whole;
    int64_t deltas = 0, ranks_wire = 0, links_wire = 0;
    for (const v1::RankStats& r : sync->ranks()) {
      deltas += r.delta_chunks();
      ranks_wire += r.wire_bytes();
      for (const auto& [why, chunks] : r.full_chunks()) whole[why] += chunks;
    }
    for (const v1::LinkBytes& link : sync->links()) links_wire += link.wire_bytes();
    INFO("seed " << seed);
    CHECK(ranks_wire > 0);
    CHECK(links_wire == ranks_wire);  // every agent said what it put on each link
    if (seed == 85) {
      CHECK(deltas > 0);
      CHECK(whole.count("new_target") == 1);
      CHECK(whole.size() == 1);
      CHECK(sync->links_size() > 0);
      for (const v1::LinkBytes& link : sync->links()) {
        if (link.path() == v1::STAGED && link.to_rank() == 3) CHECK(link.wire_bytes() == link.bytes());
      }
    } else {
      CHECK(deltas > 0);
      CHECK(whole.count("new_epoch") == 0);
      CHECK(whole.count("new_target") == 0);
    }
  }
}

// A sync's delta words, summed over its ranks.
struct DeltaTotals {
  int64_t delta_chunks = 0;
  std::map<std::string, int64_t> full_chunks;  // by why
};

DeltaTotals TotalsOf(const v1::SyncResponse& sync) {
  DeltaTotals totals;
  for (const v1::RankStats& r : sync.ranks()) {
    totals.delta_chunks += r.delta_chunks();
    for (const auto& [why, chunks] : r.full_chunks()) totals.full_chunks[why] += chunks;
  }
  return totals;
}

const v1::RankStats& StatsOf(const v1::SyncResponse& sync, int32_t rank) {
  for (const v1::RankStats& r : sync.ranks()) {
    if (r.rank() == rank) return r;
  }
  throw std::runtime_error(absl::StrCat("no stats of rank ", rank));
}

// The value of a metric line `line` (name and labels) in a /metrics answer; -1 if absent.
double MetricValue(const std::string& metrics, const std::string& line) {
  const size_t at = metrics.find("\n" + line + " ");
  if (at == std::string::npos) return -1;
  const size_t from = at + line.size() + 2;
  double value = -1;
  if (!absl::SimpleAtod(metrics.substr(from, metrics.find('\n', from) - from), &value)) return -1;
  return value;
}

TEST_CASE("delta sync after an agent is killed, during a sync or between two: what it touched goes whole, named") {
  constexpr int kStallRound = 8;
  ClusterOptions options;
  options.delta = "always";
  options.direct = "never";
  options.staging_bytes = planner::kMinStagingBytes;  // many rounds: the kill lands inside a sync
  options.sync_timeout_ms = 5000;
  options.metrics = true;
  // Rank 1's first agent stalls its third sync at kStallRound; its restarts have no fault.
  options.agent_flags[1] = {"--fault-stall-at-round", std::to_string(kStallRound), "--fault-stall-sync", "3"};
  Cluster cluster(options);
  Deployment deployment(cluster, "delta-faults", ManyRoundsModelJson(), 60);
  RequireReady(deployment);
  deployment.SetChanged(0.01);
  v1::SyncRequest with_links;  // the per-link checks below
  with_links.set_links(true);
  const auto sync_exact = [&](uint64_t seed) {
    deployment.Refill(seed);
    auto sync = SyncOnce(cluster, with_links, absl::Seconds(60));
    if (!sync.ok()) cluster.DumpLogs();
    REQUIRE(sync.ok());
    const std::vector<std::string> errors = deployment.CheckTargets(seed);
    INFO("seed " << seed << ": " << (errors.empty() ? "exact" : errors.front()));
    CHECK(errors.empty());
    return *sync;
  };

  const DeltaTotals first = TotalsOf(sync_exact(60));
  CHECK(first.delta_chunks == 0);
  CHECK(first.full_chunks.size() == 1);
  CHECK(first.full_chunks.count("new_target") == 1);  // nothing synced yet
  const DeltaTotals second = TotalsOf(sync_exact(61));
  CHECK(second.delta_chunks > 0);
  CHECK(second.full_chunks.count("new_target") == 0);

  // Killed part way through a sync: every target is invalid, rank 1's agent is new.
  deployment.Refill(62);
  absl::StatusOr<v1::SyncResponse> stalled_sync = absl::UnknownError("not run");
  std::thread syncer([&] { stalled_sync = SyncOnce(cluster, absl::Seconds(60)); });
  const bool stalled =
      WaitForLogLine(cluster.agent(1).log_path(), absl::StrCat(" stalls at round ", kStallRound), absl::Seconds(30));
  cluster.agent(1).Signal(SIGKILL);
  syncer.join();
  REQUIRE(stalled);
  REQUIRE_FALSE(stalled_sync.ok());
  RestartAgent(cluster, deployment, 1);
  const v1::SyncResponse after_stall = sync_exact(63);
  const DeltaTotals whole = TotalsOf(after_stall);
  CHECK(whole.delta_chunks == 0);
  CHECK(whole.full_chunks.size() == 2);
  CHECK(whole.full_chunks.count("invalid_target") == 1);   // into ranks 0, 2, 3
  CHECK(whole.full_chunks.count("restarted_agent") == 1);  // into rank 1
  std::ostringstream table;
  cli::PrintSyncTable(after_stall, table);
  CHECK_THAT(table.str(),
             Contains(absl::StrCat("delta sync, chunks sent whole: ", whole.full_chunks.at("invalid_target"),
                                   " invalid_target, ", whole.full_chunks.at("restarted_agent"), " restarted_agent")));
  const DeltaTotals resumed = TotalsOf(sync_exact(64));
  CHECK(resumed.delta_chunks > 0);
  CHECK(resumed.full_chunks.count("invalid_target") == 0);
  CHECK(resumed.full_chunks.count("restarted_agent") == 0);

  // Killed between syncs: rank 1's targets and its snapshots are gone; the rest hold on.
  cluster.agent(1).Signal(SIGKILL);
  RestartAgent(cluster, deployment, 1);
  const v1::SyncResponse after_restart = sync_exact(65);
  const v1::RankStats& restarted = StatsOf(after_restart, 1);
  CHECK(restarted.delta_chunks() == 0);  // it kept nothing to diff against
  CHECK(restarted.full_chunks().size() == 1);
  CHECK(restarted.full_chunks().count("restarted_agent") == 1);
  for (int32_t rank : {0, 2, 3}) {
    const v1::RankStats& other = StatsOf(after_restart, rank);
    INFO("rank " << rank);
    CHECK(other.delta_chunks() > 0);                           // to the ranks that kept their targets
    CHECK(other.full_chunks().count("restarted_agent") == 1);  // to rank 1
    CHECK(other.full_chunks().count("invalid_target") == 0);
  }
  // Per link: whole into rank 1 and out of it, deltas between the others.
  int64_t link_wire = 0;
  for (const v1::LinkBytes& link : after_restart.links()) {
    INFO("link " << link.from_rank() << " -> " << link.to_rank());
    link_wire += link.wire_bytes();
    if (link.from_rank() == 1 || link.to_rank() == 1) {
      CHECK(link.wire_bytes() == link.bytes());
      CHECK(link.changed_words() == 0);
    } else {
      CHECK(link.wire_bytes() * 10 < link.bytes());
      CHECK(link.changed_words() > 0);
    }
  }
  int64_t rank_wire = 0;
  for (const v1::RankStats& r : after_restart.ranks()) rank_wire += r.wire_bytes();
  CHECK(link_wire == rank_wire);
  const DeltaTotals last = TotalsOf(sync_exact(66));
  CHECK(last.delta_chunks > 0);
  CHECK(last.full_chunks.count("restarted_agent") == 0);

  const std::string metrics = HttpGet(cluster.MetricsPort(-1), "/metrics");
  CHECK(MetricValue(metrics, "shardsync_full_chunks_total{reason=\"restarted_agent\"}") > 0);
  CHECK(MetricValue(metrics, "shardsync_full_chunks_total{reason=\"invalid_target\"}") ==
        static_cast<double>(whole.full_chunks.at("invalid_target")));
  CHECK(MetricValue(metrics, "shardsync_delta_chunks_total") > 0);
  CHECK(MetricValue(metrics, "shardsync_wire_bytes_total") < MetricValue(metrics, "shardsync_staged_bytes_total"));
}

TEST_CASE("delta sync auto: deltas between nodes, whole inside one, named same_node; exact") {
  ClusterOptions options;
  options.delta = "auto";
  options.direct = "never";
  options.relay = "never";  // every rank's chunks to every peer: links inside and between nodes
  options.staging_bytes = 1 << 16;
  options.nodes = {"node-a", "node-a", "node-b", "node-b"};
  Cluster cluster(options);
  Deployment deployment(cluster, "delta-auto", ManyRoundsModelJson(), 70);
  RequireReady(deployment);
  deployment.SetChanged(0.01);
  for (uint64_t seed = 70; seed <= 72; ++seed) {
    if (seed > 70) deployment.Refill(seed);
    auto sync = SyncOnce(cluster, absl::Seconds(60));
    if (!sync.ok()) cluster.DumpLogs();
    REQUIRE(sync.ok());
    CHECK(deployment.CheckTargets(seed).empty());
    const DeltaTotals totals = TotalsOf(*sync);
    CHECK(totals.full_chunks.count("same_node") == 1);
    if (seed == 70) {
      CHECK(totals.delta_chunks == 0);
    } else {
      CHECK(totals.delta_chunks > 0);
      CHECK(totals.full_chunks.size() == 1);  // every chunk between nodes went as a delta
    }
  }
}

}  // namespace
}  // namespace shardsync::localsync

// End to end on this machine's CPU: a real coordinator, 4 real agents and trainer and
// rollout client processes registering shared memory, talking gRPC. Every target byte
// is checked after every sync.
#include <catch2/catch.hpp>

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/localsync/deployment.h"

namespace shardsync::localsync {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

// A small model with every kind of tensor: padded vocab, heads split unevenly over
// TP=4 (6 heads -> 2,2,1,1), row-parallel, replicated norm, a 3-D tensor of 7 rows.
std::string ModelJson(int zero_stage, const std::string& replicas, const std::string& dp = "[0, 1, 2, 3]") {
  return absl::StrCat(R"({"model": {"tensors": [
      {"name": "embed", "shape": [100, 16], "style": "VOCAB"},
      {"name": "heads", "shape": [24, 16], "style": "COLUMN", "split_unit": 4},
      {"name": "o_proj", "shape": [16, 24], "style": "ROW", "split_unit": 4},
      {"name": "norm", "shape": [16]},
      {"name": "up", "shape": [40, 16], "style": "COLUMN"},
      {"name": "down", "shape": [16, 40], "style": "ROW"},
      {"name": "cube", "shape": [7, 5, 3], "style": "COLUMN"}],
    "zero_stage": )", zero_stage, R"(, "dp_ranks": )", dp, R"(, "replicas": )", replicas, "}}");
}

struct Layout {
  const char* name;
  const char* replicas;
};
constexpr Layout kLayouts[] = {
    {"tp2x2", R"([{"ranks": [0, 1]}, {"ranks": [2, 3]}])"},
    {"tp4", R"([{"ranks": [0, 1, 2, 3]}])"},
    {"tp1-on-half", R"([{"ranks": [0]}, {"ranks": [2]}])"},
};

void RequireReady(Deployment& deployment) {
  for (const std::string& line : deployment.WaitReady()) REQUIRE_THAT(line, StartsWith("ready"));
}

int64_t BytesSent(const v1::SyncResponse& response) {
  int64_t sent = 0;
  for (const v1::RankStats& r : response.ranks()) sent += r.sent_bytes();
  return sent;
}

TEST_CASE("ZeRO-1/2/3 into TP2x2, uneven TP4 and TP1 on half the ranks sync exactly, twice") {
  Cluster cluster(ClusterOptions{});
  for (int stage = 1; stage <= 3; ++stage) {
    for (const Layout& layout : kLayouts) {
      INFO("zero stage " << stage << " into " << layout.name);
      Deployment deployment(cluster, absl::StrCat("zero", stage, "-", layout.name), ModelJson(stage, layout.replicas),
                            /*seed=*/stage * 100 + 1);
      RequireReady(deployment);
      const std::string address = deployment.RolloutAddress(0);
      CHECK(deployment.CheckTargets(stage * 100 + 1).size() > 0);  // poisoned before the sync

      auto first = SyncOnce(cluster, absl::Seconds(20));
      if (!first.ok()) cluster.DumpLogs();
      REQUIRE(first.ok());
      std::vector<std::string> errors = deployment.CheckTargets(stage * 100 + 1);
      INFO((errors.empty() ? "" : errors.front()));
      CHECK(errors.empty());
      // Under ZeRO-1/2 every rank holds the whole flat: nothing crosses processes.
      if (stage < 3) CHECK(BytesSent(*first) == 0);

      deployment.Refill(stage * 100 + 2);
      auto second = SyncOnce(cluster, absl::Seconds(20));
      REQUIRE(second.ok());
      CHECK(second->plan_seconds() == 0);  // the cached plan of this epoch
      errors = deployment.CheckTargets(stage * 100 + 2);
      CHECK(errors.empty());
      CHECK(deployment.RolloutAddress(0) == address);  // the arena never moves
    }
  }
}

TEST_CASE("a rank that lacks one of its shards: the sync is refused, naming it, and no target byte changes") {
  Cluster cluster(ClusterOptions{});
  Deployment deployment(cluster, "missing", ModelJson(3, kLayouts[0].replicas), 7, /*extra_rank=*/2,
                        "--drop-tensor up");
  RequireReady(deployment);
  const Contents before = deployment.ReadTargets();
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE_FALSE(sync.ok());
  CHECK(absl::IsFailedPrecondition(sync.status()));
  CHECK_THAT(std::string(sync.status().message()), Contains("tensor 'up'") && Contains("no byte moved") &&
                                                       Contains("rank 2") && Contains("has no source"));
  CHECK(deployment.ReadTargets() == before);
}

TEST_CASE("one agent refusing at Prepare stops every agent: nothing is written anywhere") {
  ClusterOptions options;
  options.staging_bytes = 4096;
  options.agent_max_staging_bytes[3] = 1024;  // rank 3 will refuse the budget
  Cluster cluster(options);
  Deployment deployment(cluster, "refuse", ModelJson(3, kLayouts[1].replicas), 9);
  RequireReady(deployment);
  const Contents before = deployment.ReadTargets();
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE_FALSE(sync.ok());
  CHECK_THAT(std::string(sync.status().message()), Contains("rank 3 refused") && Contains("staging budget"));
  CHECK_THAT(std::string(sync.status().message()), !Contains("rank 0 refused"));
  CHECK(deployment.ReadTargets() == before);
}

TEST_CASE("a staging budget smaller than a parameter syncs exactly and stays within the budget") {
  ClusterOptions options;
  options.staging_bytes = 96;  // a parameter here is up to 3,200 bytes
  Cluster cluster(options);
  Deployment deployment(cluster, "small-staging", ModelJson(3, kLayouts[0].replicas), 11);
  RequireReady(deployment);
  auto sync = SyncOnce(cluster, absl::Seconds(30));
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(11).empty());
  for (const v1::RankStats& r : sync->ranks()) {
    // Peak staging counts both directions with all 3 peers at once.
    CHECK(r.peak_staging_bytes() <= 96 * 2 * 3);
    CHECK(r.rounds() > 1);
  }
}

TEST_CASE("a stalled agent fails the sync within the deadline, naming it; it syncs again once it resumes") {
  ClusterOptions options;
  options.rpc_deadline_ms = 1000;
  options.sync_timeout_ms = 2000;
  Cluster cluster(options);
  Deployment deployment(cluster, "stall", ModelJson(3, kLayouts[1].replicas), 13);
  RequireReady(deployment);
  cluster.agent(1).Signal(SIGSTOP);
  const absl::Time start = absl::Now();
  auto sync = SyncOnce(cluster, absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  cluster.agent(1).Signal(SIGCONT);
  REQUIRE_FALSE(sync.ok());
  CHECK_THAT(std::string(sync.status().message()), Contains("rank 1"));
  CHECK(took < absl::Seconds(5));
  auto again = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE(again.ok());
  CHECK(deployment.CheckTargets(13).empty());
}

}  // namespace
}  // namespace shardsync::localsync

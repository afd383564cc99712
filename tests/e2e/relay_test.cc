// Agents on two nodes (--node): the trainer on node a, two rollout replicas on node b.
// With the relay each element crosses between the nodes once, and the replicas copy
// from each other in a second stage; without it every replica reads its own copy from
// node a. Real daemons and client processes (CPU).
#include <catch2/catch.hpp>

#include "client/cpp/client.h"
#include "planner/types.h"
#include "tests/e2e/small_model.h"
#include "tools/localsync/deployment.h"

namespace shardsync::localsync {
namespace {

// ZeRO-3 over ranks 0-1 (node a) into TP1 on rank 2 and on rank 3 (node b).
const std::string kDisaggregated = ModelJson(3, R"([{"ranks": [2]}, {"ranks": [3]}])", "[0, 1]");

ClusterOptions TwoNodes(const std::string& relay) {
  ClusterOptions options;
  options.nodes = {"node-a", "node-a", "node-b", "node-b"};
  options.relay = relay;
  return options;
}

// The bytes of one whole copy of the model in the target dtype.
int64_t ModelBytes(const Deployment& deployment) {
  int64_t bytes = 0;
  for (const planner::TensorLayouts& t : deployment.input().tensors) {
    bytes += planner::NumElements(t.shape) * planner::ElementBytes(t.target_dtype);
  }
  return bytes;
}

TEST_CASE("two nodes, relayed: each element crosses between them once, every target exact, verified, twice") {
  Cluster cluster(TwoNodes(""));  // the default, auto: the cost model relays here
  Deployment deployment(cluster, "relay", kDisaggregated, 71);
  RequireReady(deployment);
  client::CoordinatorClient coordinator = cluster.coordinator_client();
  auto status = coordinator.Status(absl::Seconds(5));
  REQUIRE(status.ok());
  for (const v1::AgentInfo& a : status->agents()) CHECK(a.node() == (a.rank() < 2 ? "node-a" : "node-b"));

  auto first = coordinator.Sync(absl::Seconds(20), /*verify=*/true);
  if (!first.ok()) cluster.DumpLogs();
  REQUIRE(first.ok());
  CHECK(deployment.CheckTargets(71).empty());
  CHECK(first->stages() == 2);
  CHECK(first->network_bytes() == ModelBytes(deployment));
  CHECK(first->verified_placements() == 14);  // 7 tensors on each of ranks 2 and 3
  for (const v1::RankStats& r : first->ranks()) {
    INFO("rank " << r.rank());
    // Each replica forwards what it got from node a to the other one.
    if (r.rank() >= 2) CHECK(r.sent_bytes() > 0);
  }
  deployment.Refill(72);
  auto second = coordinator.Sync(absl::Seconds(20));
  REQUIRE(second.ok());
  CHECK(deployment.CheckTargets(72).empty());
  CHECK(deployment.CheckSources(72).empty());  // sources only read; the relay reads targets

  v1::ExplainRequest request;
  auto explain = coordinator.Explain(request, absl::Seconds(5));
  REQUIRE(explain.ok());
  CHECK(explain->stages() == 2);
  CHECK(explain->network_bytes() == ModelBytes(deployment));
  CHECK(explain->relayed_bytes() > 0);
  CHECK(explain->relayed_floor_seconds() < explain->unrelayed_floor_seconds());
  CHECK(explain->network_gbps() == 50);
  for (const v1::RankStats& r : explain->ranks()) {
    INFO("rank " << r.rank());
    // Both replicas take a share of the network, neither all of it.
    if (r.rank() >= 2) CHECK((r.network_received_bytes() > 0 && r.network_received_bytes() < ModelBytes(deployment)));
  }
}

TEST_CASE("two nodes, --relay never: each replica reads its own copy across the nodes, exact") {
  Cluster cluster(TwoNodes("never"));
  Deployment deployment(cluster, "no-relay", kDisaggregated, 81);
  RequireReady(deployment);
  auto sync = SyncOnce(cluster, absl::Seconds(20), /*verify=*/true);
  if (!sync.ok()) cluster.DumpLogs();
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(81).empty());
  CHECK(sync->stages() == 1);
  CHECK(sync->network_bytes() == 2 * ModelBytes(deployment));
  for (const v1::RankStats& r : sync->ranks()) {
    if (r.rank() >= 2) CHECK(r.sent_bytes() == 0);
  }
}

TEST_CASE("a rollout rank refilled alone on the relayed node reads node a itself: nothing to relay from") {
  Cluster cluster(TwoNodes("always"));
  Deployment deployment(cluster, "relay-partial", kDisaggregated, 91);
  RequireReady(deployment);
  REQUIRE(SyncOnce(cluster, absl::Seconds(20)).ok());
  deployment.Refill(92);
  REQUIRE_THAT(deployment.RestartRollout(3), Catch::Matchers::StartsWith("ready"));
  client::CoordinatorClient coordinator = cluster.coordinator_client();
  auto refill = coordinator.Sync(absl::Seconds(20), /*verify=*/true, {3});
  if (!refill.ok()) cluster.DumpLogs();
  REQUIRE(refill.ok());
  CHECK(refill->stages() == 1);  // rank 2's target is not written now: never a source
  CHECK(deployment.CheckTargets(92, {3}).empty());
  CHECK(deployment.CheckTargets(91, {2}).empty());
}

}  // namespace
}  // namespace shardsync::localsync

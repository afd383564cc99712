// Agents on two nodes (--node): the trainer on node a, two rollout replicas on node b.
// With the relay each element crosses between the nodes once, and the replicas copy
// from each other in a second stage; without it every replica reads its own copy from
// node a; with delta sync the changed elements cross once, as deltas, and the relay
// forwards them whole inside node b. Real daemons and client processes (CPU).
#include <catch2/catch.hpp>
#include <map>
#include <string>

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

TEST_CASE(
    "relayed with --delta auto: changed elements cross into node b once, as deltas, and the relay forwards them") {
  ClusterOptions options = TwoNodes("always");
  options.delta = "auto";
  options.direct = "never";  // the relay's forward is a staged link inside node b
  Cluster cluster(options);
  Deployment deployment(cluster, "relay-delta", kDisaggregated, 101);
  RequireReady(deployment);
  deployment.SetChanged(0.01);
  v1::SyncRequest request;
  request.set_verify(true);
  request.set_links(true);  // the bytes into node b and within it, per link
  for (uint64_t seed = 101; seed <= 103; ++seed) {
    INFO("seed " << seed);
    if (seed > 101) deployment.Refill(seed);
    auto sync = SyncOnce(cluster, request, absl::Seconds(30));
    if (!sync.ok()) cluster.DumpLogs();
    REQUIRE(sync.ok());
    CHECK(deployment.CheckTargets(seed).empty());
    CHECK(sync->verified_placements() == 14);
    CHECK(sync->stages() == 2);
    CHECK(sync->network_bytes() == ModelBytes(deployment));  // each element planned into node b once
    int64_t into_b = 0, into_b_wire = 0, forwarded = 0, forwarded_wire = 0, elsewhere = 0;
    for (const v1::LinkBytes& link : sync->links()) {
      if (link.from_rank() < 2 && link.to_rank() >= 2) {
        into_b += link.bytes();
        into_b_wire += link.wire_bytes();
      } else if (link.from_rank() >= 2 && link.to_rank() >= 2) {
        forwarded += link.bytes();
        forwarded_wire += link.wire_bytes();
      } else {
        elsewhere += link.bytes();
      }
    }
    CHECK(elsewhere == 0);
    CHECK(into_b == ModelBytes(deployment));
    CHECK(forwarded > 0);
    CHECK(forwarded_wire == forwarded);  // inside a node every chunk goes whole
    int64_t deltas = 0;
    std::map<std::string, int64_t> whole;
    for (const v1::RankStats& r : sync->ranks()) {
      deltas += r.delta_chunks();
      for (const auto& [why, chunks] : r.full_chunks()) whole[why] += chunks;
    }
    CHECK(whole.count("same_node") == 1);
    if (seed == 101) {
      CHECK(deltas == 0);
      CHECK(into_b_wire == into_b);
    } else {
      CHECK(deltas > 0);
      CHECK(whole.size() == 1);          // between the nodes every chunk went as a delta
      CHECK(into_b_wire * 10 < into_b);  // 1% changed: a few percent of the bytes
    }
  }
}

}  // namespace
}  // namespace shardsync::localsync

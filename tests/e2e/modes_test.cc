// Ways to run syncs beyond a coordinator process writing every target of 4 agents:
// agent 0 serving as the coordinator (--serve-coordinator), 9 agents, partial targets
// (a sync that writes the targets of the ranks named). Real daemons and client processes
// (CPU).
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "common/tls.h"
#include "tests/e2e/small_model.h"
#include "tools/localsync/deployment.h"

namespace shardsync::localsync {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("agent 0 serving the coordinator in its own process: every sync exact, with 4 agents and with 1 alone") {
  for (int agents : {4, 1}) {
    INFO(agents << " agents");
    ClusterOptions options;
    options.agents = agents;
    options.agent0_serves_coordinator = true;
    Cluster cluster(options);  // no coordinator process: agent 0 is it
    const bool alone = agents == 1;
    Deployment deployment(
        cluster, "served",
        ModelJson(3, alone ? R"([{"ranks": [0]}])" : kLayouts[0].replicas, alone ? "[0]" : "[0, 1, 2, 3]"), 51);
    RequireReady(deployment);
    auto first = SyncOnce(cluster, absl::Seconds(20));
    if (!first.ok()) cluster.DumpLogs();
    REQUIRE(first.ok());
    CHECK(deployment.CheckTargets(51).empty());
    for (uint64_t seed = 52; seed < 55; ++seed) {
      deployment.Refill(seed);
      auto next = SyncOnce(cluster, absl::Seconds(20));
      REQUIRE(next.ok());
      CHECK(next->one_call());  // one agent, or agents of one host (their signal boards)
      CHECK(deployment.CheckTargets(seed).empty());
    }
    // The trainer beside agent 0 may sync over its unix socket: no TCP, no TLS.
    TlsConfig plaintext;
    plaintext.insecure = true;
    client::CoordinatorClient beside("unix:" + cluster.socket(0), *LoadCredentials(plaintext));
    deployment.Refill(55);
    auto over_socket = beside.Sync(absl::Seconds(20));
    INFO(over_socket.status().message());
    REQUIRE(over_socket.ok());
    CHECK(deployment.CheckTargets(55).empty());
    // So may an operator's shardsyncctl; `agents --json` gives the world's size.
    Process ctl(
        {"client/cli/shardsyncctl", "agents", "--json", "--insecure", "--coordinator", "unix:" + cluster.socket(0)},
        cluster.dir() + "/ctl.log");
    CHECK_THAT(ctl.ReadAll(absl::Seconds(60)), Contains(absl::StrCat("\"world_size\":", agents, ",")));
    CHECK(ctl.Wait(absl::Seconds(30)) == 0);
    std::ifstream log(cluster.dir() + "/agent0.log");
    const std::string agent0((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    // Its own part is a direct call; the others' over gRPC.
    const size_t joined0 = agent0.find("rank 0 joined from");
    REQUIRE(joined0 != std::string::npos);
    CHECK_THAT(agent0.substr(joined0, agent0.find('\n', joined0) - joined0), Contains("in this process"));
    for (int rank = 1; rank < agents; ++rank) {
      const size_t joined = agent0.find(absl::StrCat("rank ", rank, " joined from"));
      REQUIRE(joined != std::string::npos);
      CHECK_THAT(agent0.substr(joined, agent0.find('\n', joined) - joined), !Contains("in this process"));
    }
  }
}

// Beyond 8 ranks each thread of the coordinator's fan-out builds and sends its own
// rank's Execute (up to 8, the thread that took the sync sends them all).
TEST_CASE(
    "nine agents, each Execute sent by its own fan-out thread: every sync exact, with and without agent 0 "
    "serving the coordinator") {
  for (bool served : {false, true}) {
    INFO((served ? "agent 0 serving" : "a coordinator process"));
    ClusterOptions options;
    options.agents = 9;
    options.agent0_serves_coordinator = served;
    Cluster cluster(options);
    Deployment deployment(
        cluster, "nine",
        ModelJson(3, R"([{"ranks": [0]}, {"ranks": [4]}, {"ranks": [8]}])", "[0, 1, 2, 3, 4, 5, 6, 7, 8]"), 71);
    RequireReady(deployment);
    for (uint64_t seed = 71; seed < 74; ++seed) {
      if (seed > 71) deployment.Refill(seed);
      auto sync = SyncOnce(cluster, absl::Seconds(20));
      if (!sync.ok()) cluster.DumpLogs();
      REQUIRE(sync.ok());
      CHECK(deployment.CheckTargets(seed).empty());
    }
  }
}

TEST_CASE(
    "agent 0 serving the coordinator killed and restarted on its port: the others rejoin, the next sync is exact") {
  ClusterOptions options;
  options.agent0_serves_coordinator = true;
  Cluster cluster(options);
  Deployment deployment(cluster, "served-restart", ModelJson(3, kLayouts[0].replicas), 61);
  RequireReady(deployment);
  REQUIRE(SyncOnce(cluster, absl::Seconds(20)).ok());
  deployment.Refill(62);
  cluster.agent(0).Signal(SIGKILL);
  cluster.agent(0).Wait(absl::Seconds(5));
  cluster.StartAgent(0);  // the same port: the others' --coordinator
  for (Process* client : {&deployment.trainer(0), &deployment.rollout(0)}) {
    client->WriteLine("reregister");
    CHECK_THAT(client->ReadLine(absl::Seconds(20)), StartsWith("ready"));
  }
  // Ranks 1-3 were never told: they find the new coordinator and publish again.
  REQUIRE(deployment.WaitPublished());
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  if (!sync.ok()) cluster.DumpLogs();
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(62).empty());
}

TEST_CASE("a restarted rollout rank is refilled alone: its targets are written, every other target keeps its bytes") {
  Cluster cluster(ClusterOptions{});
  // ZeRO-3 over 4 ranks into TP2 on ranks 2-3: ranks 0 and 1 hold sources only.
  Deployment deployment(cluster, "partial", ModelJson(3, kLayouts[4].replicas), 31);
  RequireReady(deployment);
  auto first = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE(first.ok());
  CHECK(Ranks(first->target_ranks()) == std::vector<int32_t>{2, 3});
  REQUIRE(deployment.CheckTargets(31).empty());

  // The trainer steps on; rank 3's inference engine restarts with new, poisoned memory.
  deployment.Refill(32);
  REQUIRE_THAT(deployment.RestartRollout(3), StartsWith("ready"));
  CHECK_FALSE(deployment.CheckTargets(31, {3}).empty());
  client::CoordinatorClient coordinator = cluster.coordinator_client();
  auto refill = coordinator.Sync(absl::Seconds(20), /*verify=*/true, {3});
  if (!refill.ok()) cluster.DumpLogs();
  REQUIRE(refill.ok());
  CHECK(Ranks(refill->target_ranks()) == std::vector<int32_t>{3});
  CHECK(deployment.CheckTargets(32, {3}).empty());  // the trainer's values now
  CHECK(deployment.CheckTargets(31, {2}).empty());  // untouched: the last full sync's
  CHECK(refill->verified_placements() == 7);        // (tensor, rank 3) for the 7 tensors
  for (const v1::RankStats& r : refill->ranks()) {
    INFO("rank " << r.rank());
    CHECK((r.rank() == 3) == (r.received_bytes() + r.local_bytes() > 0));  // only rank 3 writes
  }

  // A rank outside the world, or one holding no target: refused before a byte moves.
  const Contents before = deployment.ReadTargets();
  auto outside = coordinator.Sync(absl::Seconds(20), false, {4});
  REQUIRE_FALSE(outside.ok());
  CHECK(absl::IsInvalidArgument(outside.status()));
  CHECK_THAT(std::string(outside.status().message()), Contains("no byte moved") && Contains("outside a world of 4"));
  auto no_target = coordinator.Sync(absl::Seconds(20), false, {0, 3});
  REQUIRE_FALSE(no_target.ok());
  CHECK_THAT(std::string(no_target.status().message()),
             Contains("target rank 0 holds no target") && Contains("registered on rank 2, rank 3"));
  CHECK(deployment.ReadTargets() == before);

  // A full sync writes every target again, from the plan it kept.
  auto full = SyncOnce(cluster, absl::Seconds(20));
  REQUIRE(full.ok());
  CHECK(Ranks(full->target_ranks()) == std::vector<int32_t>{2, 3});
  CHECK(deployment.CheckTargets(32).empty());
}

}  // namespace
}  // namespace shardsync::localsync

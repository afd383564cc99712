// The agent's desks do not wait on each other: a Prepare that waits for a slow direct
// peer (its TargetMemory answer) holds up no other call of the agent.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "absl/synchronization/notification.h"
#include "daemon/agent/agent.h"
#include "daemon/coordinator/epoch_plan.h"
#include "executor/device.h"
#include "tests/agent/heap_backend.h"
#include "tests/agent/one_tensor.h"

namespace shardsync::agent {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("a Prepare waiting for a slow direct peer holds up no other call of the agent") {
  constexpr int32_t kWorld = 2;
  HeapBackend backend;
  Registry registry(0, {&backend});
  CoordinatorLink link(UnusedLink(), registry);  // never started: this test is the coordinator
  executor::HostDevice device;
  executor::Mailbox mailbox;
  executor::LoopbackTransport transport(0, {{0, &mailbox}});
  // The direct peer answers only when the test lets it.
  absl::Notification asked, answer;
  PeerTargets targets(0, registry, [&](const std::string&, const v1::TargetMemoryRequest&, absl::Time) {
    asked.Notify();
    answer.WaitForNotificationWithTimeout(absl::Minutes(5));  // a hang deadline
    return absl::StatusOr<v1::TargetMemoryResponse>(absl::UnavailableError("the peer went away"));
  });
  AgentConfig config;
  config.rpc_deadline = absl::Minutes(5);
  Agent agent(config, registry, link, device, transport, mailbox, DirectPath{&transport, &targets});
  REQUIRE(registry.Add(ZeroThreeTrainer(0, kWorld), Peer{1, 0}).ok());

  // Rank 0's half of a ZeRO-3 "w" goes into rank 1's whole copy: rank 1 is a direct peer.
  Registry peer_registry(1, {&backend});
  REQUIRE(peer_registry.Add(ZeroThreeTrainer(1, kWorld), Peer{1, 0}).ok());
  REQUIRE(peer_registry.Add(WholeRollout(1), Peer{2, 0}).ok());
  std::map<int32_t, v1::PublishRequest> published;
  for (const Registry* r : {&registry, &peer_registry}) {
    const int32_t rank = r == &registry ? 0 : 1;
    published[rank].set_rank(rank);
    int64_t version = 0;
    for (v1::PublishedLayout& layout : r->Layouts(&version)) *published[rank].add_layouts() = layout;
  }
  coordinator::EpochOptions options;
  options.world_size = kWorld;
  options.staging_bytes = 4096;
  absl::StatusOr<coordinator::EpochPlan> epoch = coordinator::PlanEpoch(published, {}, {}, options);
  REQUIRE(epoch.ok());
  v1::PrepareRequest prepare = *epoch->requests[0];
  prepare.set_sync_id("sync-1");
  prepare.set_digest(epoch->digest);
  prepare.set_staging_bytes(4096);
  prepare.set_deadline_ms(10000);
  prepare.set_world_size(kWorld);
  prepare.add_direct_peers(1);
  (*prepare.mutable_peer_addresses())[1] = "127.0.0.1:1";

  v1::PrepareResponse prepared;
  std::thread preparing([&] { prepared = agent.Prepare(prepare); });
  REQUIRE(asked.WaitForNotificationWithTimeout(absl::Minutes(1)));
  // While the peer keeps rank 0 waiting, every other call answers.
  CHECK(agent.Status().rank() == 0);
  CHECK(agent.Progress().rank() == 0);
  CHECK_THAT(agent.Metrics(), Contains("shardsync_agent_clients 1\n"));
  CHECK(agent.Admit(WholeRollout(0), Peer{2, geteuid()}).ok());
  v1::TargetMemoryRequest memory;
  memory.set_from_rank(1);
  memory.add_buffers("arena");
  CHECK(agent.TargetMemory(memory).ok());
  v1::TransferRequest chunk;
  chunk.set_sync_id("sync-1");
  chunk.set_from_rank(1);
  CHECK_THAT(std::string(agent.Transfer(chunk, absl::Now() + absl::Seconds(1)).message()),
             Contains("has prepared no sync 'sync-1'"));
  answer.Notify();
  preparing.join();
  CHECK_FALSE(prepared.ok());
  CHECK_THAT(prepared.refusal(), Contains("rank 1 gave no target memory") && Contains("the peer went away"));
}

}  // namespace
}  // namespace shardsync::agent

// The agent's desks do not wait on each other: a Prepare that waits for a slow direct
// peer (its TargetMemory answer) holds up no other call of the agent, not even the next
// Prepare, and does not replace what that one kept when it ends. Target memory goes only
// to the peers a sync has write here; a rank that refused a sync says so, and only that
// answer makes the asking rank a follower in the refusal.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "daemon/agent/agent.h"
#include "daemon/coordinator/epoch_plan.h"
#include "executor/device.h"
#include "tests/agent/heap_backend.h"
#include "tests/agent/one_tensor.h"

namespace shardsync::agent {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("a Prepare waiting for a slow direct peer holds up no other call, nor overwrites a later Prepare") {
  constexpr int32_t kWorld = 2;
  HeapBackend backend;
  Registry registry(0, {&backend});
  CoordinatorLink link(UnusedLink(), registry);  // never started: this test is the coordinator
  executor::HostDevice device;
  executor::Mailbox mailbox;
  executor::LoopbackTransport transport(0, {{0, &mailbox}});
  // Rank 0's half of a ZeRO-3 "w" goes into rank 1's whole copy: rank 1 is a direct peer.
  Registry peer_registry(1, {&backend});
  REQUIRE(peer_registry.Add(ZeroThreeTrainer(1, kWorld), Peer{1, 0}).ok());
  REQUIRE(peer_registry.Add(WholeRollout(1), Peer{2, 0}).ok());
  // The direct peer answers, with its targets' handles, only when the test lets it.
  absl::Notification asked, answer;
  PeerTargets targets(0, registry, [&](const std::string&, const v1::TargetMemoryRequest& request, absl::Time) {
    asked.Notify();
    REQUIRE(answer.WaitForNotificationWithTimeout(absl::Minutes(5)));  // a hang deadline
    v1::TargetMemoryResponse response;
    for (const std::string& name : request.buffers()) {
      int64_t registered_at = 0;
      auto handle = peer_registry.TargetHandle(name, &registered_at);
      if (!handle.ok()) return absl::StatusOr<v1::TargetMemoryResponse>(handle.status());
      *response.add_buffers() = *handle;
      response.add_registered_at(registered_at);
    }
    return absl::StatusOr<v1::TargetMemoryResponse>(response);
  });
  AgentConfig config;
  config.rpc_deadline = absl::Minutes(5);
  Agent agent(config, registry, link, device, transport, mailbox, DirectPath{&transport, &targets});
  REQUIRE(registry.Add(ZeroThreeTrainer(0, kWorld), Peer{1, 0}).ok());

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
  v1::PrepareRequest prepare = *coordinator::ScheduleRequest(*epoch, 0);
  prepare.set_sync_id("sync-1");
  prepare.set_digest(epoch->digest());
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
  // Rank 1 writes nothing here in this plan: refused at once, not kept waiting.
  v1::TargetMemoryRequest memory;
  memory.set_from_rank(1);
  memory.set_sync_id("sync-1");
  memory.add_buffers("arena");
  CHECK(absl::IsPermissionDenied(agent.TargetMemory(memory).status()));
  v1::TransferRequest chunk;
  chunk.set_sync_id("sync-1");
  chunk.set_from_rank(1);
  CHECK_THAT(std::string(agent.Transfer(chunk, absl::Now() + absl::Seconds(1)).message()),
             Contains("has prepared no sync 'sync-1'"));
  // The coordinator gave up on that Prepare and sends the next sync's: it is kept, and
  // the first, answered later, does not replace it.
  v1::PrepareRequest next = prepare;
  next.set_sync_id("sync-2");
  next.clear_direct_peers();
  const v1::PrepareResponse second = agent.Prepare(next);
  INFO(second.refusal());
  CHECK(second.ok());
  answer.Notify();
  preparing.join();
  CHECK_FALSE(prepared.ok());  // it mapped the peer's targets, but came before sync-2
  CHECK_THAT(prepared.refusal(), Contains("sync sync-1 was prepared again since this Prepare came"));
  // A peer's chunk is taken only for a prepared sync: sync-2's waits for its receive
  // (none comes: its deadline), sync-1's is refused.
  chunk.set_sync_id("sync-2");
  const absl::Status taken = agent.Transfer(chunk, absl::Now() + absl::Milliseconds(50));
  INFO(taken.message());
  CHECK_FALSE(absl::IsFailedPrecondition(taken));
  chunk.set_sync_id("sync-1");
  CHECK_THAT(std::string(agent.Transfer(chunk, absl::Now() + absl::Seconds(1)).message()),
             Contains("has prepared no sync 'sync-1'"));
}

TEST_CASE("a Prepare that ends after a later one does not replace what the later one kept") {
  HeapBackend backend;
  Registry registry(0, {&backend});
  CoordinatorLink link(UnusedLink(), registry);  // never started
  SyncLedger ledger(0, link);
  const int64_t first = ledger.TakeTicket();
  const int64_t second = ledger.TakeTicket();
  PreparedSync later;
  later.sync_id = "sync-2";
  CHECK(ledger.Keep("plan", later, second));
  PreparedSync earlier;
  earlier.sync_id = "sync-1";
  CHECK_FALSE(ledger.Keep("plan", earlier, first));
  CHECK_FALSE(ledger.Renewed("plan", earlier, first));
  REQUIRE(ledger.Find("plan").has_value());
  CHECK(ledger.Find("plan")->sync_id == "sync-2");
  CHECK(ledger.Renewed("plan", later, ledger.TakeTicket()));
}

TEST_CASE("target memory goes to the peers a sync this rank prepares has write here, and only what they write") {
  HeapBackend backend;
  Registry registry(1, {&backend});
  REQUIRE(registry.Add(WholeRollout(1), Peer{2, 0}).ok());
  v1::TargetMemoryRequest ask;
  ask.set_from_rank(0);
  ask.set_sync_id("sync-a");
  ask.add_buffers("arena");
  PlannedWriters writers;
  writers.buffers[0] = {"arena"};
  writers.scratch_bytes = 4096;

  PeerDesk impatient(1, registry, absl::Milliseconds(50));
  const absl::Status unknown = impatient.TargetMemory(ask).status();
  CHECK(absl::IsPermissionDenied(unknown));
  CHECK_THAT(std::string(unknown.message()), Contains("has not prepared sync 'sync-a'"));

  // A sync this rank prepares while the ask waits answers it.
  PeerDesk desk(1, registry, absl::Minutes(5));  // a hang deadline
  std::thread learning([&] {
    absl::SleepFor(absl::Milliseconds(20));
    desk.Expect("sync-a", writers);
  });
  const absl::StatusOr<v1::TargetMemoryResponse> answered = desk.TargetMemory(ask);
  learning.join();
  REQUIRE(answered.ok());
  CHECK(answered->buffers(0).name() == "arena");

  // Another rank, another buffer, another scratch size: refused by name.
  v1::TargetMemoryRequest rogue = ask;
  rogue.set_from_rank(2);
  CHECK_THAT(std::string(desk.TargetMemory(rogue).status().message()),
             Contains("has rank 2 write no target of rank 1"));
  rogue = ask;
  rogue.add_buffers("flat");
  const absl::Status other = desk.TargetMemory(rogue).status();
  CHECK(absl::IsPermissionDenied(other));
  CHECK_THAT(std::string(other.message()), Contains("write no buffer 'flat' of rank 1"));
  writers.buffers[0].insert(std::string(planner::kScratchBufferName));
  desk.Expect("sync-b", writers);
  rogue = ask;
  rogue.set_sync_id("sync-b");
  rogue.add_buffers(std::string(planner::kScratchBufferName));
  rogue.set_scratch_bytes(int64_t{3} << 30);
  CHECK_THAT(std::string(desk.TargetMemory(rogue).status().message()),
             Contains("asked for a scratch of 3221225472 bytes; sync 'sync-b' has 4096"));
  rogue.set_scratch_bytes(4096);
  const absl::Status planned_size = desk.TargetMemory(rogue).status();  // past the plan: the heap makes no scratch
  INFO(planned_size.message());
  CHECK_FALSE(absl::IsPermissionDenied(planned_size));

  // Only the last syncs are kept.
  PeerDesk quick(1, registry, absl::Milliseconds(50));
  quick.Expect("sync-a", writers);
  for (int k = 0; k < 16; ++k) quick.Expect(absl::StrCat("sync-later-", k), writers);
  CHECK_THAT(std::string(quick.TargetMemory(ask).status().message()), Contains("has not prepared sync 'sync-a'"));
}

TEST_CASE("a rank that refused a sync says so to a peer that asks; the peer refuses as its follower") {
  HeapBackend backend;
  Registry refusing(1, {&backend});
  REQUIRE(refusing.Add(WholeRollout(1), Peer{2, 0}).ok());
  PeerDesk desk(1, refusing, absl::Minutes(5));  // a hang deadline
  PlannedWriters none;
  none.refused = true;
  desk.Expect("sync-r", none);
  v1::TargetMemoryRequest ask;
  ask.set_from_rank(0);
  ask.set_sync_id("sync-r");
  ask.add_buffers("arena");
  const absl::StatusOr<v1::TargetMemoryResponse> answered = desk.TargetMemory(ask);
  REQUIRE(answered.ok());
  CHECK(answered->refused());
  CHECK(answered->buffers_size() == 0);  // no memory for a refused sync

  // The asking rank's mapping fails with the follower's mark, naming the peer; any
  // other failure carries no such mark.
  Registry asking(0, {&backend});
  PeerTargets targets(0, asking, [&](const std::string&, const v1::TargetMemoryRequest& request, absl::Time) {
    return desk.TargetMemory(request);
  });
  const auto mapped = targets.Map(1, "127.0.0.1:1", "sync-r", {"arena"}, 0, absl::Now() + absl::Minutes(5));
  REQUIRE_FALSE(mapped.ok());
  CHECK(mapped.status().GetPayload(kPeerRefusedPayload).has_value());
  CHECK_THAT(std::string(mapped.status().message()), Contains("rank 1 refused sync 'sync-r'"));
  PeerTargets aborting(0, asking, [&](const std::string&, const v1::TargetMemoryRequest&, absl::Time) {
    return absl::StatusOr<v1::TargetMemoryResponse>(absl::AbortedError("the peer's server is going away"));
  });
  const auto failed = aborting.Map(1, "127.0.0.1:1", "sync-r", {"arena"}, 0, absl::Now() + absl::Minutes(5));
  REQUIRE_FALSE(failed.ok());
  CHECK_FALSE(failed.status().GetPayload(kPeerRefusedPayload).has_value());
}

}  // namespace
}  // namespace shardsync::agent

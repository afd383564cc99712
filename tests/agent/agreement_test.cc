// Two real Agents in one process (host memory, loopback transport): the schedule the
// coordinator's own code makes (PlanEpoch), delivered by Prepare once, then syncs in one Execute
// call that prepares itself. A rank that is not ready stops every rank before any
// byte is written, and says why.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "daemon/agent/agent.h"
#include "daemon/coordinator/epoch_plan.h"
#include "executor/device.h"
#include "tests/agent/heap_backend.h"
#include "tests/agent/one_tensor.h"

namespace shardsync::agent {
namespace {

using Catch::Matchers::Contains;

constexpr int32_t kWorld = 2;
struct Rank {
  HeapBackend backend;
  Registry registry;
  CoordinatorLink link;  // never started: this test is the coordinator
  executor::HostDevice device;
  executor::Mailbox mailbox;
  std::unique_ptr<executor::LoopbackTransport> transport;
  std::unique_ptr<Agent> agent;

  Rank(int32_t rank, const std::map<int32_t, executor::Mailbox*>& mailboxes)
      : registry(rank, {&backend}), link(UnusedLink(), registry) {
    transport = std::make_unique<executor::LoopbackTransport>(rank, mailboxes);
    AgentConfig config;
    config.rank = rank;
    agent = std::make_unique<Agent>(config, registry, link, device, *transport, mailbox);
  }
  float* Source() { return reinterpret_cast<float*>(registry.Find("flat")->memory->data()); }
  float* Target() { return reinterpret_cast<float*>(registry.Find("arena")->memory->data()); }
};

// Fills every rank's source partition from one random tensor; poisons every target.
std::vector<float> Refill(std::vector<std::unique_ptr<Rank>>& ranks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-4, 4);
  std::vector<float> tensor(kElements);
  for (float& v : tensor) v = value(rng);
  for (int32_t r = 0; r < kWorld; ++r) {
    std::memcpy(ranks[r]->Source(), tensor.data() + r * kElements / kWorld, kElements / kWorld * 4);
    std::memset(ranks[r]->Target(), 0xAB, kElements * 4);
  }
  return tensor;
}

// Every rank's Execute at once; the results by rank.
std::vector<absl::StatusOr<v1::ExecuteResponse>> ExecuteAll(std::vector<std::unique_ptr<Rank>>& ranks,
                                                            const std::vector<v1::ExecuteRequest>& requests) {
  std::vector<absl::StatusOr<v1::ExecuteResponse>> results(kWorld, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] { results[r] = ranks[r]->agent->Execute(requests[r]); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

v1::PrepareRequest PrepareFor(const v1::PrepareRequest& schedule, const std::string& sync_id, const std::string& digest,
                              bool with_schedule) {
  v1::PrepareRequest request = with_schedule ? schedule : v1::PrepareRequest();
  request.set_schedule_cached(!with_schedule);
  request.set_sync_id(sync_id);
  request.set_digest(digest);
  request.set_staging_bytes(4096);
  request.set_deadline_ms(10000);
  request.set_communicator_generation(1);
  request.set_world_size(kWorld);
  return request;
}

// Both ranks, each with its ZeRO-3 source and whole target of "w" registered, and
// their epoch planned as the coordinator plans it.
struct PlannedWorld {
  std::map<int32_t, executor::Mailbox> boxes;
  std::map<int32_t, executor::Mailbox*> mailboxes;
  std::vector<std::unique_ptr<Rank>> ranks;
  coordinator::EpochPlan epoch;

  PlannedWorld() {
    for (int32_t r = 0; r < kWorld; ++r) mailboxes[r] = &boxes[r];
    std::map<int32_t, v1::PublishRequest> published;
    for (int32_t r = 0; r < kWorld; ++r) {
      ranks.push_back(std::make_unique<Rank>(r, mailboxes));
      REQUIRE(ranks[r]->registry.Add(ZeroThreeTrainer(r, kWorld), Peer{1, 0}).ok());
      REQUIRE(ranks[r]->registry.Add(WholeRollout(r), Peer{2, 0}).ok());
      published[r].set_rank(r);
      int64_t version = 0;
      for (v1::PublishedLayout& layout : ranks[r]->registry.Layouts(&version)) *published[r].add_layouts() = layout;
    }
    coordinator::EpochOptions options;
    options.world_size = kWorld;
    options.staging_bytes = 4096;
    absl::StatusOr<coordinator::EpochPlan> planned = coordinator::PlanEpoch(published, {}, {}, options);
    REQUIRE(planned.ok());
    epoch = *std::move(planned);
  }
};

TEST_CASE("one Execute call prepares itself; a rank not ready stops every rank before any byte is written") {
  PlannedWorld world;
  std::vector<std::unique_ptr<Rank>>& ranks = world.ranks;
  const coordinator::EpochPlan& epoch = world.epoch;
  const std::string digest = epoch.digest();

  // Sync 1: Prepare with the schedule, then Execute.
  std::vector<float> tensor = Refill(ranks, 1);
  std::vector<v1::ExecuteRequest> execute(kWorld);
  for (int32_t r = 0; r < kWorld; ++r) {
    const v1::PrepareRequest schedule = *coordinator::ScheduleRequest(epoch, r);
    const v1::PrepareResponse prepared = ranks[r]->agent->Prepare(PrepareFor(schedule, "sync-1", digest, true));
    INFO(prepared.refusal());
    REQUIRE(prepared.ok());
    execute[r].set_sync_id("sync-1");
    execute[r].set_digest(digest);
  }
  for (const auto& result : ExecuteAll(ranks, execute)) REQUIRE(result.ok());
  for (int32_t r = 0; r < kWorld; ++r) CHECK(std::memcmp(ranks[r]->Target(), tensor.data(), kElements * 4) == 0);

  SECTION("sync 2 in one call, the peers those of sync 1: every target exact, and bytes crossed between the ranks") {
    tensor = Refill(ranks, 2);
    for (int32_t r = 0; r < kWorld; ++r) {
      execute[r].set_sync_id("sync-2");
      *execute[r].mutable_prepare() = PrepareFor({}, "sync-2", digest, false);
      execute[r].mutable_prepare()->set_peers_cached(true);  // as the coordinator's one call
    }
    const auto results = ExecuteAll(ranks, execute);
    for (int32_t r = 0; r < kWorld; ++r) {
      INFO("rank " << r << ": " << results[r].status().message());
      REQUIRE(results[r].ok());
      CHECK(results[r]->stats().received_bytes() == kElements / kWorld * 4);
      CHECK(std::memcmp(ranks[r]->Target(), tensor.data(), kElements * 4) == 0);
    }
  }

  SECTION("rank 1's rollout left: both ranks refuse with FAILED_PRECONDITION and no target byte changes") {
    Refill(ranks, 3);
    ranks[1]->registry.Remove("rollout");
    const std::vector<float> poisoned(ranks[0]->Target(), ranks[0]->Target() + kElements);
    for (int32_t r = 0; r < kWorld; ++r) {
      execute[r].set_sync_id("sync-3");
      *execute[r].mutable_prepare() = PrepareFor({}, "sync-3", digest, false);
    }
    const auto results = ExecuteAll(ranks, execute);
    REQUIRE_FALSE(results[0].ok());
    REQUIRE_FALSE(results[1].ok());
    CHECK(absl::IsFailedPrecondition(results[0].status()));
    CHECK(absl::IsFailedPrecondition(results[1].status()));
    CHECK_THAT(std::string(results[1].status().message()),
               Contains("no byte moved on rank 1") && Contains("buffer 'arena'") && Contains("not registered"));
    CHECK_THAT(std::string(results[0].status().message()),
               Contains("no byte moved on rank 0") && Contains("another rank was not ready"));
    CHECK(std::memcmp(ranks[0]->Target(), poisoned.data(), kElements * 4) == 0);
  }

  SECTION("a communicator generation the agent never built: refused at once, without waiting for the others") {
    execute[0].set_sync_id("sync-4");
    *execute[0].mutable_prepare() = PrepareFor({}, "sync-4", digest, false);
    execute[0].mutable_prepare()->set_communicator_generation(2);
    execute[0].mutable_prepare()->set_deadline_ms(300000);  // what waiting for rank 1 would take
    const absl::Time start = absl::Now();
    const absl::StatusOr<v1::ExecuteResponse> result = ranks[0]->agent->Execute(execute[0]);
    CHECK(absl::Now() - start < absl::Minutes(1));
    REQUIRE_FALSE(result.ok());
    CHECK(absl::IsFailedPrecondition(result.status()));
    CHECK_THAT(std::string(result.status().message()), Contains("communicator generation 2 is not built"));
  }

  SECTION("an Abort that comes before its Execute: the Execute stops at once, writing nothing") {
    v1::AbortRequest abort;
    abort.set_sync_id("sync-6");
    abort.set_reason("rank 1 failed");
    const bool valid_before = ranks[0]->agent->Status().target_valid();
    ranks[0]->agent->Abort(abort);
    execute[0].set_sync_id("sync-6");
    *execute[0].mutable_prepare() = PrepareFor({}, "sync-6", digest, false);
    execute[0].mutable_prepare()->set_deadline_ms(300000);  // what waiting for rank 1 would take
    const absl::Time start = absl::Now();
    const absl::StatusOr<v1::ExecuteResponse> result = ranks[0]->agent->Execute(execute[0]);
    CHECK(absl::Now() - start < absl::Minutes(1));
    REQUIRE_FALSE(result.ok());
    CHECK(absl::IsFailedPrecondition(result.status()));
    CHECK_THAT(std::string(result.status().message()), Contains("aborted before it started"));
    CHECK(ranks[0]->agent->Status().target_valid() == valid_before);  // nothing was written
  }

  SECTION("a schedule the agent does not hold: refused at once") {
    execute[1].set_sync_id("sync-5");
    execute[1].set_digest("another-plan");
    *execute[1].mutable_prepare() = PrepareFor({}, "sync-5", "another-plan", false);
    const absl::StatusOr<v1::ExecuteResponse> result = ranks[1]->agent->Execute(execute[1]);
    REQUIRE_FALSE(result.ok());
    CHECK(absl::IsFailedPrecondition(result.status()));
    CHECK_THAT(std::string(result.status().message()), Contains("does not hold the schedule of plan another-plan"));
  }
}

TEST_CASE("Prepare refuses a world without its rank, peers outside it, and regions outside a buffer") {
  PlannedWorld world;
  std::vector<std::unique_ptr<Rank>>& ranks = world.ranks;
  const coordinator::EpochPlan& epoch = world.epoch;
  const auto refusal = [&](int32_t rank, const v1::PrepareRequest& request) {
    const v1::PrepareResponse response = ranks[rank]->agent->Prepare(request);
    CHECK_FALSE(response.ok());
    return response.refusal();
  };
  v1::PrepareRequest request = PrepareFor(*coordinator::ScheduleRequest(epoch, 1), "sync-1", epoch.digest(), true);
  REQUIRE(ranks[1]->agent->Prepare(request).ok());

  SECTION("a world of one rank lacks rank 1") {
    request.set_world_size(1);
    CHECK_THAT(refusal(1, request), Contains("world of 1 ranks lacks this rank 1"));
  }
  SECTION("an address for a rank outside the world") {
    (*request.mutable_peer_addresses())[5] = "127.0.0.1:1";
    CHECK_THAT(refusal(1, request), Contains("an address is given for rank 5 in a world of 2"));
  }
  SECTION("a signal board for this rank itself") {
    (*request.mutable_peer_signal_boards())[1] = "/shardsync-board-1-1";
    CHECK_THAT(refusal(1, request),
               Contains("a signal board is given for rank 1 in a world of 2 where this is rank 1"));
  }
  SECTION("peers said to be cached in a Prepare that brings its schedule") {
    request.set_peers_cached(true);
    CHECK_THAT(refusal(1, request),
               Contains("the peers of communicator generation 1 are not held here (this agent holds generation 0)"));
  }
  SECTION("a deadline of no time") {
    request.set_deadline_ms(0);
    CHECK_THAT(refusal(1, request), Contains("deadline of 0 ms is outside"));
  }
  SECTION("a stream with a rank outside the world, full and cached") {
    v1::PrepareRequest full = PrepareFor(*coordinator::ScheduleRequest(epoch, 0), "sync-1", epoch.digest(), true);
    REQUIRE(ranks[0]->agent->Prepare(full).ok());
    full.set_world_size(1);  // rank 0 receives from rank 1, which this world lacks
    CHECK_THAT(refusal(0, full), Contains("the schedule has a stream with rank 1 in a world of 1"));
    v1::PrepareRequest cached = PrepareFor({}, "sync-2", epoch.digest(), false);
    cached.set_world_size(1);
    CHECK_THAT(refusal(0, cached), Contains("the schedule has a stream with rank 1 in a world of 1"));
  }
  SECTION("a target buffer that holds only half of what the plan writes into it") {
    Rank half(1, world.mailboxes);
    REQUIRE(half.registry.Add(ZeroThreeTrainer(1, kWorld), Peer{1, 0}).ok());
    v1::RegisterRequest rollout = OneTensorRegistration("rollout", v1::TARGET, "arena", kElements * 4 / 2);
    v1::Placement* rows = rollout.mutable_tensors(0)->add_placements();
    rows->set_rank(1);
    rows->set_buffer("arena");
    for (int64_t extent : {kRows / 2, kCols}) {
      rows->mutable_box()->add_lo(0);
      rows->mutable_box()->add_hi(extent);
    }
    REQUIRE(half.registry.Add(rollout, Peer{2, 0}).ok());
    const v1::PrepareResponse response = half.agent->Prepare(request);
    CHECK_FALSE(response.ok());
    CHECK_THAT(response.refusal(), Contains("tensor 'w': a segment lies outside buffer"));
    CHECK_THAT(response.refusal(), Contains("arena' (768 bytes)"));
  }
}

}  // namespace
}  // namespace shardsync::agent

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

namespace shardsync::agent {
namespace {

using Catch::Matchers::Contains;

constexpr int32_t kWorld = 2;
constexpr int64_t kRows = 16, kCols = 24, kElements = kRows * kCols;  // float32

// One client's registration of one buffer and of tensor "w" in it (layout left to fill).
v1::RegisterRequest OneBuffer(const std::string& client, v1::Role role, const std::string& buffer, int64_t bytes) {
  v1::RegisterRequest request;
  request.set_client_id(client);
  request.set_role(role);
  v1::RegisteredBuffer* registered = request.add_buffers();
  registered->set_name(buffer);
  registered->set_bytes(bytes);
  registered->mutable_handle()->set_shm_name("heap");
  v1::TensorLayout* tensor = request.add_tensors();
  tensor->set_name("w");
  tensor->add_shape(kRows);
  tensor->add_shape(kCols);
  tensor->set_dtype(v1::FLOAT32);
  return request;
}

// Tensor "w" [16, 24]: ZeRO-3 over both ranks as the source, whole on each rank (TP1 x 2)
// as the target.
v1::RegisterRequest Trainer(int32_t rank) {
  v1::RegisterRequest request = OneBuffer("trainer", v1::SOURCE, "flat", kElements / kWorld * 4);
  v1::FlatPlacement* part = request.mutable_tensors(0)->add_flat_placements();
  part->set_rank(rank);
  part->set_buffer("flat");
  part->set_begin(rank * kElements / kWorld);
  part->set_end((rank + 1) * kElements / kWorld);
  return request;
}

v1::RegisterRequest Rollout(int32_t rank) {
  v1::RegisterRequest request = OneBuffer("rollout", v1::TARGET, "arena", kElements * 4);
  v1::Placement* whole = request.mutable_tensors(0)->add_placements();
  whole->set_rank(rank);
  whole->set_buffer("arena");
  for (int64_t extent : {kRows, kCols}) {
    whole->mutable_box()->add_lo(0);
    whole->mutable_box()->add_hi(extent);
  }
  return request;
}

LinkConfig UnusedLink() {
  LinkConfig config;
  config.coordinator = "127.0.0.1:1";
  config.credentials.channel = grpc::InsecureChannelCredentials();
  config.credentials.insecure = true;
  return config;
}

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

TEST_CASE("one Execute call prepares itself; a rank not ready stops every rank before any byte is written") {
  std::map<int32_t, executor::Mailbox> boxes;
  std::map<int32_t, executor::Mailbox*> mailboxes;
  for (int32_t r = 0; r < kWorld; ++r) mailboxes[r] = &boxes[r];
  std::vector<std::unique_ptr<Rank>> ranks;
  std::map<int32_t, v1::PublishRequest> published;
  for (int32_t r = 0; r < kWorld; ++r) {
    ranks.push_back(std::make_unique<Rank>(r, mailboxes));
    REQUIRE(ranks[r]->registry.Add(Trainer(r), Peer{1, 0}).ok());
    REQUIRE(ranks[r]->registry.Add(Rollout(r), Peer{2, 0}).ok());
    published[r].set_rank(r);
    int64_t version = 0;
    for (v1::PublishedLayout& layout : ranks[r]->registry.Layouts(&version)) *published[r].add_layouts() = layout;
  }
  // The coordinator's planning of the epoch.
  coordinator::EpochOptions options;
  options.world_size = kWorld;
  options.staging_bytes = 4096;
  auto epoch = coordinator::PlanEpoch(published, {}, {}, options);
  REQUIRE(epoch.ok());
  const std::string digest = epoch->digest;

  // Sync 1: Prepare with the schedule, then Execute.
  std::vector<float> tensor = Refill(ranks, 1);
  std::vector<v1::ExecuteRequest> execute(kWorld);
  for (int32_t r = 0; r < kWorld; ++r) {
    const v1::PrepareRequest& schedule = *epoch->requests[r];
    const v1::PrepareResponse prepared = ranks[r]->agent->Prepare(PrepareFor(schedule, "sync-1", digest, true));
    INFO(prepared.refusal());
    REQUIRE(prepared.ok());
    execute[r].set_sync_id("sync-1");
    execute[r].set_digest(digest);
  }
  for (const auto& result : ExecuteAll(ranks, execute)) REQUIRE(result.ok());
  for (int32_t r = 0; r < kWorld; ++r) CHECK(std::memcmp(ranks[r]->Target(), tensor.data(), kElements * 4) == 0);

  SECTION("sync 2 in one call: every target exact, and bytes crossed between the ranks") {
    tensor = Refill(ranks, 2);
    for (int32_t r = 0; r < kWorld; ++r) {
      execute[r].set_sync_id("sync-2");
      *execute[r].mutable_prepare() = PrepareFor({}, "sync-2", digest, false);
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
    const absl::Time start = absl::Now();
    const absl::StatusOr<v1::ExecuteResponse> result = ranks[0]->agent->Execute(execute[0]);
    CHECK(absl::Now() - start < absl::Seconds(1));
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
    const absl::Time start = absl::Now();
    const absl::StatusOr<v1::ExecuteResponse> result = ranks[0]->agent->Execute(execute[0]);
    CHECK(absl::Now() - start < absl::Seconds(1));
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

}  // namespace
}  // namespace shardsync::agent

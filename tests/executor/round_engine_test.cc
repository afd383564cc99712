// The round engine on every rank at once (threads, loopback transport): random layouts
// sync bit for bit, staging stays within the budget, and a silent peer is named.
#include "executor/round_engine.h"

#include <catch2/catch.hpp>
#include <functional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "daemon/common/schedule_codec.h"
#include "executor/buffer_check.h"
#include "executor/mailbox.h"
#include "planner/builders.h"
#include "planner/cost.h"
#include "planner/model_layout.h"
#include "planner/schedule.h"
#include "tests/executor/buffer_table.h"
#include "tests/planner/random_layouts.h"
#include "tests/planner/sync_check.h"

namespace shardsync::executor {
namespace {

using Catch::Matchers::Contains;

struct World {
  std::map<int32_t, Mailbox> mailboxes;
  std::map<int32_t, Mailbox*> pointers;
  explicit World(int ranks) {
    for (int r = 0; r < ranks; ++r) pointers[r] = &mailboxes[r];
  }
};

// Every rank's engine on its own thread over loopback; the results by rank.
std::vector<absl::StatusOr<ExecutionStats>> RunEveryRank(const planner::Plan& plan,
                                                         const std::vector<planner::Schedule>& schedules,
                                                         testing::HostBuffers& buffers, int64_t budget) {
  World world(plan.num_ranks);
  std::vector<absl::StatusOr<ExecutionStats>> results(plan.num_ranks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < plan.num_ranks; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport transport(r, world.pointers);
      HostDevice device;
      RoundEngine engine(device, transport);
      results[r] =
          engine.Run("sync-1", plan, schedules[r], TableFor(r, buffers), budget, absl::Now() + absl::Seconds(20));
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST_CASE("every rank's round engine over loopback syncs random layouts bit for bit, relayed or not") {
  const auto policy = planner::LocalFirstLeastLoaded();
  int relayed = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    std::mt19937_64 rng(seed);
    auto input = planner::ExpandModel(testing::RandomModel(rng));
    REQUIRE(input.ok());
    const int64_t budget = std::vector<int64_t>{16, 32, 100, 4096}[seed % 4];
    // Every other layout over two or three nodes with the relay: each rank runs its
    // relay stage once its own first stage is done, whatever the others do.
    const bool relay = seed % 2 == 0;
    if (relay) testing::PlaceOnRandomNodes(*input, 2 + seed % 3, rng);
    auto plan = planner::MakePlan(*input, *policy, planner::PlanOptions{relay});
    REQUIRE(plan.ok());
    relayed += plan->stages == 2;
    auto schedules = planner::MakeSchedules(*plan, budget);
    REQUIRE(schedules.ok());
    INFO("seed " << seed << " budget " << budget << " stages " << plan->stages);

    testing::HostBuffers buffers = testing::AllocateBuffers(*input);
    const testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
    const testing::HostBuffers before = buffers;
    const std::vector<absl::StatusOr<ExecutionStats>> results = RunEveryRank(*plan, *schedules, buffers, budget);
    const planner::PlanStats planned = planner::ComputeStats(*plan, *schedules);
    for (int32_t r = 0; r < plan->num_ranks; ++r) {
      REQUIRE(results[r].ok());
      const ExecutionStats& s = *results[r];
      CHECK(s.sent_bytes == planned.ranks[r].sent_bytes);
      CHECK(s.received_bytes == planned.ranks[r].received_bytes);
      CHECK(s.local_bytes == planned.ranks[r].local_bytes);
      std::set<int32_t> peers;
      for (const planner::Stage& stage : (*schedules)[r].stages) {
        for (const auto* streams : {&stage.sends, &stage.receives}) {
          for (const planner::PeerStream& stream : *streams) peers.insert(stream.peer);
        }
      }
      CHECK(s.peak_staging_bytes <= budget * static_cast<int64_t>(peers.size()));
      CHECK(s.peak_peer_staging_bytes <= budget);
    }
    const std::vector<std::string> errors = testing::CheckSync(*input, values, before, buffers);
    INFO((errors.empty() ? std::string() : errors.front()));
    CHECK(errors.empty());
  }
  CHECK(relayed > 15);
}

// Rank 0 holds tensors a and b back to back; rank 1 wants them in bf16 at element 0,
// then at b_offset.
struct TwoTensors {
  planner::PlanInput input;
  explicit TwoTensors(int64_t b_offset, planner::DType source = planner::DType::kBFloat16) {
    const planner::Index shape{4, 8};
    input.buffers = {planner::Buffer{planner::Holder{0, 0}, 64 * 4}, planner::Buffer{planner::Holder{1, 0}, 96 * 2}};
    for (const auto& [name, source_offset, target_offset] :
         {std::tuple<const char*, int64_t, int64_t>{"a", 0, 0}, {"b", 32, b_offset}}) {
      input.tensors.push_back(planner::TensorLayouts{name, shape, source, planner::DType::kBFloat16,
                                                     planner::Replicated(shape, {0}, 0, {source_offset}),
                                                     planner::Replicated(shape, {1}, 0, {target_offset})});
    }
  }
};

// Both ranks run; returns their stats and checks every target element.
std::vector<ExecutionStats> RunBoth(const planner::PlanInput& input, int64_t budget) {
  auto plan = planner::MakePlan(input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  auto schedules = planner::MakeSchedules(*plan, budget);
  REQUIRE(schedules.ok());
  std::mt19937_64 rng(7);
  testing::HostBuffers buffers = testing::AllocateBuffers(input);
  const testing::TensorValues values = testing::PrepareBuffers(input, rng, buffers);
  const testing::HostBuffers before = buffers;
  std::vector<absl::StatusOr<ExecutionStats>> results = RunEveryRank(*plan, *schedules, buffers, budget);
  const std::vector<std::string> errors = testing::CheckSync(input, values, before, buffers);
  INFO((errors.empty() ? std::string() : errors.front()));
  CHECK(errors.empty());
  std::vector<ExecutionStats> stats;
  for (auto& result : results) {
    REQUIRE(result.ok());
    stats.push_back(*result);
  }
  return stats;
}

TEST_CASE("a chunk whose parts lie back to back on a side moves without staging on that side") {
  // 128 bytes of a and b in one chunk (slots of 128 bytes): back to back on both sides.
  std::vector<ExecutionStats> stats = RunBoth(TwoTensors(32).input, 512);
  CHECK(stats[0].rounds == 1);
  CHECK(stats[0].sent_bytes == 128);
  CHECK(stats[0].peak_staging_bytes == 0);
  CHECK(stats[1].peak_staging_bytes == 0);
  // A gap between a and b on the target: the sender still sends straight from its
  // buffer, the receiver stages the chunk and unpacks it.
  stats = RunBoth(TwoTensors(40).input, 512);
  CHECK(stats[0].peak_staging_bytes == 0);
  CHECK(stats[1].peak_staging_bytes == 128);
  CHECK(stats[1].peak_peer_staging_bytes == 128);
}

TEST_CASE("two rounds in flight hold two slots of staging, within the budget per peer") {
  // float32 sources become bf16 on the link, so every chunk is packed and unpacked:
  // slots of 24 bytes (a budget of 96 is four of them), 128 bytes in 6 rounds, two of
  // them staged at once on each side (one direction each here).
  const std::vector<ExecutionStats> stats = RunBoth(TwoTensors(40, planner::DType::kFloat32).input, 96);
  for (const ExecutionStats& s : stats) {
    CHECK(s.rounds == 6);
    CHECK(s.peak_peer_staging_bytes == 48);
    CHECK(s.peak_staging_bytes == 48);
  }
  CHECK(stats[1].received_bytes == 128);
}

// Every rank's engine over loopback where `direct(a, b)` links take the direct path:
// each rank runs its plan as an agent decodes it (the peers' buffers after its own, as
// in PrepareRequest), the direct peers' targets mapped into its table (here: the same
// host memory), completion messages over a loopback of their own.
std::vector<absl::StatusOr<ExecutionStats>> RunEveryRankDirect(const planner::Plan& plan,
                                                               const std::vector<planner::Schedule>& schedules,
                                                               testing::HostBuffers& buffers, int64_t budget,
                                                               const std::function<bool(int32_t, int32_t)>& direct,
                                                               const std::set<int32_t>& running) {
  int32_t ids = 0;
  for (const auto& [holder, bytes] : buffers) ids = std::max(ids, holder.buffer + 1);
  std::vector<std::string> names;
  for (int32_t id = 0; id < ids; ++id) names.push_back(absl::StrCat("buffer-", id));
  const auto id_of = [](const std::string& name) { return std::stoi(name.substr(7)); };
  World data(plan.num_ranks), signals(plan.num_ranks);
  std::vector<absl::StatusOr<ExecutionStats>> results(plan.num_ranks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t r : running) {
    threads.emplace_back([&, r] {
      auto local = daemon::DecodeSchedule(daemon::EncodeSchedule(plan, schedules[r], names), r);
      if (!local.ok()) {  // Catch2's assertions are for the main thread
        results[r] = local.status();
        return;
      }
      BufferTable table(local->buffer_count(), nullptr);
      for (size_t id = 0; id < local->buffer_names.size(); ++id) {
        table[id] = buffers.at(planner::Holder{r, id_of(local->buffer_names[id])}).data();
      }
      DirectLinks links;
      for (size_t k = 0; k < local->peer_buffers.size(); ++k) {
        const daemon::PeerBufferName& peer = local->peer_buffers[k];
        if (direct(r, peer.rank))
          table[local->buffer_names.size() + k] = buffers.at({peer.rank, id_of(peer.name)}).data();
      }
      for (int32_t peer = 0; peer < plan.num_ranks; ++peer) {
        if (peer != r && direct(r, peer)) links.peers.push_back(peer);
      }
      LoopbackTransport transport(r, data.pointers), messages(r, signals.pointers);
      links.signals = &messages;
      HostDevice device;
      RoundEngine engine(device, transport);
      results[r] = engine.Run(
          "sync-1", local->plan, local->schedule, table, budget,
          absl::Now() + absl::Seconds(running.size() == static_cast<size_t>(plan.num_ranks) ? 20 : 1), nullptr, links);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST_CASE("the direct path: senders write their peers' targets in place, mixed with staged links, bit for bit") {
  const auto policy = planner::LocalFirstLeastLoaded();
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    std::mt19937_64 rng(seed);
    auto input = planner::ExpandModel(testing::RandomModel(rng));
    REQUIRE(input.ok());
    const int64_t budget = std::vector<int64_t>{16, 100, 4096}[seed % 3];
    const bool relay = seed % 2 == 0;
    if (relay) testing::PlaceOnRandomNodes(*input, 2 + seed % 2, rng);
    auto plan = planner::MakePlan(*input, *policy, planner::PlanOptions{relay});
    REQUIRE(plan.ok());
    auto schedules = planner::MakeSchedules(*plan, budget);
    REQUIRE(schedules.ok());
    // Every link direct in a third of the layouts, a mix of direct and staged links in the rest.
    const auto direct = [seed](int32_t a, int32_t b) { return seed % 3 == 0 || (a + b + seed) % 2 == 0; };
    INFO("seed " << seed << " budget " << budget << " stages " << plan->stages);

    testing::HostBuffers buffers = testing::AllocateBuffers(*input);
    const testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
    const testing::HostBuffers before = buffers;
    std::set<int32_t> every;
    for (int32_t r = 0; r < plan->num_ranks; ++r) every.insert(r);
    const auto results = RunEveryRankDirect(*plan, *schedules, buffers, budget, direct, every);
    for (int32_t r = 0; r < plan->num_ranks; ++r) {
      REQUIRE(results[r].ok());
      int64_t direct_sent = 0, direct_received = 0;
      for (const planner::Stage& stage : (*schedules)[r].stages) {
        for (const planner::PeerStream& stream : stage.sends) {
          if (direct(r, stream.peer)) direct_sent += stream.bytes;
        }
        for (const planner::PeerStream& stream : stage.receives) {
          if (direct(r, stream.peer)) direct_received += stream.bytes;
        }
      }
      CHECK(results[r]->direct_sent_bytes == direct_sent);
      CHECK(results[r]->direct_received_bytes == direct_received);
      if (seed % 3 == 0) {  // every link direct: no round, no staging
        CHECK(results[r]->rounds == 0);
        CHECK(results[r]->peak_staging_bytes == 0);
      }
    }
    const std::vector<std::string> errors = testing::CheckSync(*input, values, before, buffers);
    INFO((errors.empty() ? std::string() : errors.front()));
    CHECK(errors.empty());
  }
}

TEST_CASE("a direct receiver whose sender never says it is done fails at the deadline, naming the sender") {
  const TwoTensors two(32);
  auto plan = planner::MakePlan(two.input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  auto schedules = planner::MakeSchedules(*plan, 512);
  REQUIRE(schedules.ok());
  testing::HostBuffers buffers = testing::AllocateBuffers(two.input);
  const auto results = RunEveryRankDirect(*plan, *schedules, buffers, 512, [](int32_t, int32_t) { return true; }, {1});
  REQUIRE(absl::IsUnavailable(results[1].status()));
  CHECK_THAT(std::string(results[1].status().message()), Contains("rank 0"));
}

TEST_CASE("a direct write past the end of the peer's mapped buffer is refused, naming the buffer and rank") {
  const TwoTensors two(32);  // rank 1's targets: a and b back to back, 128 bf16 bytes
  auto plan = planner::MakePlan(two.input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  auto schedules = planner::MakeSchedules(*plan, 512);
  REQUIRE(schedules.ok());
  auto local = daemon::DecodeSchedule(daemon::EncodeSchedule(*plan, (*schedules)[0], {"arena"}), 0);
  REQUIRE(local.ok());
  REQUIRE(local->peer_buffers.size() == 1);
  std::vector<int64_t> sizes(local->buffer_count(), 256);
  std::vector<std::string> names = local->buffer_names;
  names.push_back(local->peer_buffers[0].name);
  const int32_t peer = 1;
  sizes.back() = 128;
  CHECK(CheckDirectWritesFit(local->plan, 0, {&peer, 1}, sizes, names).ok());
  sizes.back() = 127;
  const absl::Status refused = CheckDirectWritesFit(local->plan, 0, {&peer, 1}, sizes, names);
  REQUIRE(absl::IsFailedPrecondition(refused));
  CHECK_THAT(std::string(refused.message()),
             Contains("a direct write lies outside buffer 'arena' of rank 1 (127 bytes)"));
}

TEST_CASE("a delivery waits for its posted receive; a silent peer is named at the deadline") {
  Mailbox mailbox;
  uint8_t into[4] = {0, 0, 0, 0};
  const uint8_t data[4] = {1, 2, 3, 4};
  std::thread sender([&] { CHECK(mailbox.Deliver("s", 7, 0, data, 4, absl::Now() + absl::Seconds(5)).ok()); });
  absl::SleepFor(absl::Milliseconds(20));  // the sender is now blocked: nothing is posted yet
  const RecvOp from7{7, into, 4};
  uint8_t other[4];
  const RecvOp from9{9, other, 4};
  mailbox.Post("s", 0, {from7, from9});
  const absl::Status waited = mailbox.Wait(absl::Now() + absl::Milliseconds(200));
  sender.join();
  CHECK(into[3] == 4);
  CHECK(absl::IsUnavailable(waited));
  CHECK_THAT(std::string(waited.message()), Contains("rank 9"));

  mailbox.Abort("s", "peer 9 died");
  CHECK(absl::IsAborted(mailbox.Deliver("s", 9, 0, data, 4, absl::Now() + absl::Seconds(1))));
  // The abort belongs to sync "s": a delivery for the next sync waits for its receive.
  CHECK(absl::IsDeadlineExceeded(mailbox.Deliver("t", 9, 0, data, 4, absl::Now() + absl::Milliseconds(50))));
}

}  // namespace
}  // namespace shardsync::executor

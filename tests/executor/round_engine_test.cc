// The round engine on every rank at once (threads, loopback transport): random layouts
// sync bit for bit, with delta sync too, staging stays within the budget, and a silent
// peer is named.
#include "executor/round_engine.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/schedule_codec.h"
#include "executor/buffer_check.h"
#include "executor/delta_codec.h"
#include "executor/mailbox.h"
#include "planner/box.h"
#include "planner/builders.h"
#include "planner/cost.h"
#include "planner/model_layout.h"
#include "planner/schedule.h"
#include "tests/executor/buffer_table.h"
#include "tests/executor/reference_quantizer.h"
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

// Every rank's engine on its own thread over loopback; the results by rank. With
// `deltas` (one per rank), delta sync on, each rank with its own snapshots.
std::vector<absl::StatusOr<ExecutionStats>> RunEveryRank(const planner::Plan& plan,
                                                         const std::vector<planner::Schedule>& schedules,
                                                         testing::HostBuffers& buffers, int64_t budget,
                                                         const std::string& sync_id = "sync-1",
                                                         const std::vector<DeltaRun>& deltas = {}) {
  World world(plan.num_ranks);
  std::vector<absl::StatusOr<ExecutionStats>> results(plan.num_ranks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < plan.num_ranks; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport transport(r, world.pointers);
      HostDevice device;
      RoundEngine engine(device, transport);
      RunInputs run{sync_id, plan, schedules[r], TableFor(r, buffers), budget, absl::Now() + absl::Seconds(20),
                    nullptr, {}};
      if (!deltas.empty()) run.delta = &deltas[r];
      results[r] = engine.Run(run);
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

// A trainer's step: each byte of the values new with probability `fraction`, written
// into the sources.
void StepSources(const planner::PlanInput& input, double fraction, std::mt19937_64& rng, testing::TensorValues& values,
                 testing::HostBuffers& buffers) {
  std::bernoulli_distribution pick(fraction);
  for (std::vector<uint8_t>& v : values) {
    for (uint8_t& b : v) {
      if (pick(rng)) b = static_cast<uint8_t>(rng() | 1);
    }
  }
  testing::WriteSources(input, values, buffers);
}

// Each rank's delta run over its own snapshots, every other rank's targets said to hold
// sync `baseline` (none: the first sync).
std::vector<DeltaRun> DeltaRuns(std::vector<DeltaSnapshots>& snapshots, const std::string& baseline) {
  const int32_t ranks = static_cast<int32_t>(snapshots.size());
  std::vector<DeltaRun> deltas(ranks);
  for (int32_t r = 0; r < ranks; ++r) {
    deltas[r].digest = "plan";
    deltas[r].snapshots = &snapshots[r];
    for (int32_t peer = 0; peer < ranks; ++peer) {
      if (baseline.empty() || peer == r) continue;
      deltas[r].peer_versions[peer] = baseline;
      deltas[r].senders.insert(peer);
    }
  }
  return deltas;
}

TEST_CASE("delta sync: changed sources move as deltas onto the targets' last sync, bit for bit, at every fraction") {
  const auto policy = planner::LocalFirstLeastLoaded();
  int64_t full_wire = 0, delta_wire = 0, sent = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    auto input = planner::ExpandModel(testing::RandomModel(rng));
    REQUIRE(input.ok());
    const int64_t budget = std::vector<int64_t>{16, 32, 100, 4096}[seed % 4];
    const bool relay = seed % 2 == 0;
    if (relay) testing::PlaceOnRandomNodes(*input, 2 + seed % 3, rng);
    auto plan = planner::MakePlan(*input, *policy, planner::PlanOptions{relay});
    REQUIRE(plan.ok());
    if (!plan->quantizes.empty()) continue;
    auto schedules = planner::MakeSchedules(*plan, budget);
    REQUIRE(schedules.ok());
    INFO("seed " << seed << " budget " << budget << " stages " << plan->stages);
    testing::HostBuffers buffers = testing::AllocateBuffers(*input);
    testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
    std::vector<DeltaSnapshots> snapshots(plan->num_ranks, DeltaSnapshots(int64_t{1} << 30));
    // Each sync: the sources stepped (a fraction of elements new), every peer's targets
    // said to hold `baseline` (none: the first sync, or a stale word: nothing matches).
    const auto sync = [&](const std::string& id, const std::string& baseline, double fraction) {
      StepSources(*input, fraction, rng, values, buffers);
      const testing::HostBuffers before = buffers;
      const auto results = RunEveryRank(*plan, *schedules, buffers, budget, id, DeltaRuns(snapshots, baseline));
      ExecutionStats total;
      for (int32_t r = 0; r < plan->num_ranks; ++r) {
        INFO(id << " rank " << r);
        REQUIRE(results[r].ok());
        total.sent_bytes += results[r]->sent_bytes;
        total.wire_bytes += results[r]->wire_bytes;
        total.delta_chunks += results[r]->delta_chunks;
        for (const auto& [why, chunks] : results[r]->full_chunks) total.full_chunks[why] += chunks;
      }
      const std::vector<std::string> errors = testing::CheckSync(*input, values, before, buffers);
      INFO(id << ": " << (errors.empty() ? std::string() : errors.front()));
      CHECK(errors.empty());
      return total;
    };
    const ExecutionStats first = sync("sync-1", "", 0.0);
    CHECK(first.delta_chunks == 0);
    CHECK(first.wire_bytes == first.sent_bytes);
    CHECK(first.full_chunks.size() == (first.sent_bytes > 0 ? 1 : 0));  // every chunk: its target holds nothing
    CHECK(first.full_chunks.count("new_target") == first.full_chunks.size());
    full_wire += first.wire_bytes;
    const ExecutionStats unchanged = sync("sync-2", "sync-1", 0.0);
    CHECK(unchanged.wire_bytes <= unchanged.sent_bytes);
    delta_wire += unchanged.wire_bytes;
    sent += unchanged.sent_bytes;
    sync("sync-3", "sync-2", 0.01);
    sync("sync-4", "sync-3", 0.5);
    sync("sync-5", "sync-4", 1.0);
    const ExecutionStats stale = sync("sync-6", "sync-4", 0.1);  // the targets hold sync-5's
    CHECK(stale.delta_chunks == 0);
    CHECK(stale.full_chunks.size() == (stale.sent_bytes > 0 ? 1 : 0));  // every chunk: another sync's snapshot
    CHECK(stale.full_chunks.count("stale_snapshot") == stale.full_chunks.size());
    sync("sync-7", "sync-6", 0.001);
  }
  INFO("unchanged: " << delta_wire << " bytes on the wire for " << sent);
  CHECK(sent > 0);
  CHECK(delta_wire * 4 < sent);  // a mode byte per block of a chunk, against the chunk
  CHECK(full_wire == sent);
}

TEST_CASE("delta sync: a chunk of several pieces goes as a delta of each piece, bit for bit") {
  // 5 MiB of bfloat16, ZeRO-3 over ranks 0 and 1 into TP=2 on ranks 1 and 0: each rank
  // sends the other 2.5 MiB, one chunk of three pieces (the last half of one).
  planner::ModelLayoutSpec spec;
  spec.tensors.push_back(planner::MakeTensor("w", {2560, 1024}, planner::DType::kBFloat16, planner::TpStyle::kColumn));
  spec.dp_ranks = {0, 1};
  spec.replicas = {{1, 0}};
  auto input = planner::ExpandModel(spec);
  REQUIRE(input.ok());
  auto plan = planner::MakePlan(*input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  constexpr int64_t kBudget = int64_t{16} << 20;
  auto schedules = planner::MakeSchedules(*plan, kBudget);
  REQUIRE(schedules.ok());
  std::mt19937_64 rng(5);
  testing::HostBuffers buffers = testing::AllocateBuffers(*input);
  testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
  std::vector<DeltaSnapshots> snapshots(2, DeltaSnapshots(int64_t{1} << 30));
  std::string held;  // the sync the targets hold
  for (const double fraction : {0.0, 0.01, 0.3}) {
    StepSources(*input, fraction, rng, values, buffers);
    const testing::HostBuffers before = buffers;
    const std::string id = absl::StrCat("sync-", fraction);
    const auto results = RunEveryRank(*plan, *schedules, buffers, kBudget, id, DeltaRuns(snapshots, held));
    INFO("changed " << fraction);
    for (int32_t r = 0; r < 2; ++r) {
      REQUIRE(results[r].ok());
      CHECK(results[r]->rounds == 1);
      CHECK(results[r]->sent_bytes > 2 * kPieceBytes);
      CHECK(results[r]->delta_chunks == (held.empty() ? 0 : 1));
      if (fraction == 0.01) CHECK(results[r]->wire_bytes * 20 < results[r]->sent_bytes);
    }
    CHECK(testing::CheckSync(*input, values, before, buffers).empty());
    held = id;
  }
}

TEST_CASE("delta sync: links inside a node under auto go whole, named, and keep no snapshot") {
  std::mt19937_64 rng(77);
  auto input = planner::ExpandModel(testing::RandomModel(rng));
  REQUIRE(input.ok());
  auto plan = planner::MakePlan(*input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  REQUIRE(plan->quantizes.empty());
  auto schedules = planner::MakeSchedules(*plan, 4096);
  REQUIRE(schedules.ok());
  testing::HostBuffers buffers = testing::AllocateBuffers(*input);
  testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
  std::vector<DeltaSnapshots> snapshots(plan->num_ranks, DeltaSnapshots(int64_t{1} << 30));
  std::vector<DeltaRun> deltas = DeltaRuns(snapshots, "");
  for (int32_t r = 0; r < plan->num_ranks; ++r) {
    for (int32_t peer = 0; peer < plan->num_ranks; ++peer) {
      if (peer != r) deltas[r].full_peers[peer] = kSameNodeWord;
    }
  }
  const testing::HostBuffers before = buffers;
  const auto results = RunEveryRank(*plan, *schedules, buffers, 4096, "sync-1", deltas);
  int64_t whole = 0, sent = 0;
  for (int32_t r = 0; r < plan->num_ranks; ++r) {
    REQUIRE(results[r].ok());
    CHECK(snapshots[r].bytes() == 0);
    for (const auto& [why, chunks] : results[r]->full_chunks) {
      CHECK(why == kSameNodeWord);
      whole += chunks;
    }
    sent += results[r]->sent_bytes;
  }
  CHECK(sent > 0);
  CHECK(whole > 0);
  CHECK(testing::CheckSync(*input, values, before, buffers).empty());
}

// `encoded`, a delta of a whole chunk of `bytes`, as one piece.
Mailbox::Piece DeltaPiece(const std::string& encoded, int64_t bytes) {
  return Mailbox::Piece{
      reinterpret_cast<const uint8_t*>(encoded.data()), static_cast<int64_t>(encoded.size()), 0, bytes, bytes, true};
}

TEST_CASE("a delta for a receive without its baseline is refused, naming the sender") {
  Mailbox mailbox;
  uint8_t target[8] = {};
  mailbox.Post("s", 0, {RecvOp{3, target, 8, /*baseline=*/false}});
  std::string encoded;
  const uint8_t now[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EncodeDelta(now, target, 8, encoded);
  const absl::Status refused = mailbox.Deliver("s", 3, 0, DeltaPiece(encoded, 8), absl::Now() + absl::Seconds(5));
  CHECK_THAT(std::string(refused.message()), Contains("rank 3 sent a delta for round 0"));
  mailbox.Post("s", 1, {RecvOp{3, target, 8, /*baseline=*/true}});
  REQUIRE(mailbox.Deliver("s", 3, 1, DeltaPiece(encoded, 8), absl::Now() + absl::Seconds(5)).ok());
  CHECK(std::equal(now, now + 8, target));
}

// Rank 0 holds tensors a and b back to back; rank 1 wants them in bf16 at element 0,
// then at b_offset.
struct TwoTensors {
  planner::PlanInput input;
  explicit TwoTensors(int64_t b_offset, planner::DType source = planner::DType::kBFloat16) {
    const planner::Index shape{4, 8};
    input.buffers = {planner::Buffer{planner::Holder{0, 0}, 64 * 4, ""},
                     planner::Buffer{planner::Holder{1, 0}, 96 * 2, ""}};
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
  // The plan names its scratch buffers itself (planner/quantize.h).
  const auto id_of = [&](const std::string& name) {
    return name == planner::kScratchBufferName ? plan.scratch.front().holder.buffer : std::stoi(name.substr(7));
  };
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
      results[r] =
          engine.Run({"sync-1", local->plan, local->schedule, table, budget,
                      absl::Now() + absl::Seconds(running.size() == static_cast<size_t>(plan.num_ranks) ? 20 : 1),
                      nullptr, links});
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
      int64_t direct_sent = 0, direct_received = 0, staged_sent = 0;
      for (const planner::Stage& stage : (*schedules)[r].stages) {
        for (const planner::PeerStream& stream : stage.sends) {
          (direct(r, stream.peer) ? direct_sent : staged_sent) += stream.bytes;
        }
        for (const planner::PeerStream& stream : stage.receives) {
          if (direct(r, stream.peer)) direct_received += stream.bytes;
        }
      }
      CHECK(results[r]->direct_sent_bytes == direct_sent);
      CHECK(results[r]->staged_sent_bytes == staged_sent);
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
  const Mailbox::Piece whole{data, 4, 0, 4, 4};
  absl::Status delivered;
  std::thread sender([&] { delivered = mailbox.Deliver("s", 7, 0, whole, absl::Now() + absl::Seconds(5)); });
  absl::SleepFor(absl::Milliseconds(20));  // the sender is now blocked: nothing is posted yet
  const RecvOp from7{7, into, 4};
  uint8_t other[4];
  const RecvOp from9{9, other, 4};
  mailbox.Post("s", 0, {from7, from9});
  const absl::Status waited = mailbox.Wait(absl::Now() + absl::Milliseconds(200));
  sender.join();
  CHECK(delivered.ok());
  CHECK(into[3] == 4);
  CHECK(absl::IsUnavailable(waited));
  CHECK_THAT(std::string(waited.message()), Contains("rank 9"));

  mailbox.Abort("s", "peer 9 died");
  CHECK(absl::IsAborted(mailbox.Deliver("s", 9, 0, whole, absl::Now() + absl::Seconds(1))));
  // The abort belongs to sync "s": a delivery for the next sync waits for its receive.
  CHECK(absl::IsDeadlineExceeded(mailbox.Deliver("t", 9, 0, whole, absl::Now() + absl::Milliseconds(50))));
}

TEST_CASE("chunks from many peers go into their receives at once, in pieces in any order, every byte exact") {
  Mailbox mailbox;
  constexpr int kPeers = 8, kRounds = 20, kSenders = 3;  // threads per peer, each sending every third piece
  constexpr int64_t kBytes = int64_t{1} << 18;
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint8_t>> sent(kPeers, std::vector<uint8_t>(kBytes));
  std::vector<std::vector<uint8_t>> into(kPeers, std::vector<uint8_t>(kBytes));
  for (int round = 0; round < kRounds; ++round) {
    for (auto& bytes : sent) {
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    }
    // Each peer's chunk cut at random points into pieces, sent last first.
    std::vector<std::vector<Mailbox::Piece>> pieces(kPeers);
    for (int peer = 0; peer < kPeers; ++peer) {
      for (int64_t at = 0; at < kBytes;) {
        const int64_t bytes = std::min<int64_t>(kBytes - at, 1 + static_cast<int64_t>(rng() % 40000));
        pieces[peer].push_back(Mailbox::Piece{sent[peer].data() + at, bytes, at, bytes, kBytes});
        at += bytes;
      }
      std::reverse(pieces[peer].begin(), pieces[peer].end());
    }
    std::vector<RecvOp> receives;
    for (int peer = 0; peer < kPeers; ++peer) receives.push_back(RecvOp{peer, into[peer].data(), kBytes});
    std::vector<std::thread> senders;
    std::vector<absl::Status> delivered(kPeers * kSenders);  // each sender's first failure
    for (int peer = 0; peer < kPeers; ++peer) {
      for (int first = 0; first < kSenders; ++first) {
        senders.emplace_back([&, peer, first] {
          absl::Status& status = delivered[peer * kSenders + first];
          for (size_t i = first; i < pieces[peer].size() && status.ok(); i += kSenders) {
            status = mailbox.Deliver("s", peer, round, pieces[peer][i], absl::Now() + absl::Seconds(60));
          }
        });
      }
    }
    mailbox.Post("s", round, receives);
    const absl::Status waited = mailbox.Wait(absl::Now() + absl::Seconds(60));
    for (std::thread& t : senders) t.join();
    REQUIRE(waited.ok());
    for (const absl::Status& status : delivered) REQUIRE(status.ok());
    for (int peer = 0; peer < kPeers; ++peer) CHECK(into[peer] == sent[peer]);
  }
}

TEST_CASE("a chunk's pieces must cover it once: a piece twice, past its end or of another chunk is refused") {
  Mailbox mailbox;
  uint8_t into[10] = {};
  const uint8_t data[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  mailbox.Post("s", 0, {RecvOp{4, into, 10}});
  const auto refused = [&](Mailbox::Piece piece) {
    const absl::Status status = mailbox.Deliver("s", 4, 0, piece, deadline);
    CHECK(status.code() == absl::StatusCode::kInternal);
    return std::string(status.message());
  };
  // Mailbox::Piece{data, bytes, offset, span, chunk_bytes, delta}
  REQUIRE(mailbox.Deliver("s", 4, 0, Mailbox::Piece{data + 6, 4, 6, 4, 10}, deadline).ok());
  CHECK_THAT(refused(Mailbox::Piece{data + 5, 3, 5, 3, 10}), Contains("rank 4 sent bytes 5 to 8 of round 0 twice"));
  CHECK_THAT(refused(Mailbox::Piece{data, 10, 0, 10, 10}), Contains("twice"));
  CHECK_THAT(refused(Mailbox::Piece{data, 3, 8, 3, 10}), Contains("rank 4 sent 3 bytes at 8 of round 0"));
  CHECK_THAT(refused(Mailbox::Piece{data, 1, -1, 1, 10}), Contains("at -1"));
  CHECK_THAT(refused(Mailbox::Piece{data, 1, INT64_MAX, 1, 10}), Contains("the receive holds 10"));
  CHECK_THAT(refused(Mailbox::Piece{data, 2, 0, 3, 10}), Contains("rank 4 sent 3 bytes at 0 of round 0 in 2"));
  CHECK_THAT(refused(Mailbox::Piece{data, 2, 0, 2, 12}),
             Contains("rank 4 sent 12 bytes for round 0; the receive expects 10"));
  std::string encoded;
  EncodeDelta(data, into, 6, encoded);
  CHECK_THAT(refused(Mailbox::Piece{reinterpret_cast<const uint8_t*>(encoded.data()),
                                    static_cast<int64_t>(encoded.size()), 0, 6, 10, true}),
             Contains("rank 4 sent a delta for round 0; this receive holds no baseline"));
  // What was refused took nothing: the rest of the chunk completes it, and only then.
  CHECK(absl::IsUnavailable(mailbox.Wait(absl::Now() + absl::Milliseconds(20))));
  REQUIRE(mailbox.Deliver("s", 4, 0, Mailbox::Piece{data, 6, 0, 6, 10}, deadline).ok());
  REQUIRE(mailbox.Wait(deadline).ok());
  CHECK(std::equal(data, data + 10, into));
}

TEST_CASE("a chunk's pieces may be deltas onto the receiver's copy and raw bytes, each exactly its span") {
  Mailbox mailbox;
  uint8_t into[10] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9};  // the baseline: the receiver's copy
  const uint8_t baseline[10] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  const uint8_t data[10] = {1, 9, 3, 9, 5, 9, 7, 8, 9, 10};
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  mailbox.Post("s", 0, {RecvOp{4, into, 10, /*baseline=*/true}});
  std::string encoded;
  EncodeDelta(data, baseline, 6, encoded);
  const Mailbox::Piece delta{
      reinterpret_cast<const uint8_t*>(encoded.data()), static_cast<int64_t>(encoded.size()), 0, 6, 10, true};
  Mailbox::Piece short_span = delta;  // an encoding of 6 bytes said to hold 4
  short_span.span = 4;
  const absl::Status refused = mailbox.Deliver("s", 4, 0, short_span, deadline);
  CHECK(refused.code() == absl::StatusCode::kInternal);
  CHECK_THAT(std::string(refused.message()), Contains("rank 4's delta for round 0"));
  CHECK(std::equal(baseline, baseline + 10, into));  // a refused encoding wrote nothing
  Mailbox mailbox2;                                  // the refused delta took its span in the first: start again
  mailbox2.Post("s", 0, {RecvOp{4, into, 10, /*baseline=*/true}});
  REQUIRE(mailbox2.Deliver("s", 4, 0, Mailbox::Piece{data + 6, 4, 6, 4, 10}, deadline).ok());
  REQUIRE(mailbox2.Deliver("s", 4, 0, delta, deadline).ok());
  REQUIRE(mailbox2.Wait(deadline).ok());
  CHECK(std::equal(data, data + 10, into));
}

using planner::DType;
using planner::Holder;
using planner::Index;

// Random block-quantized tensors (bfloat16 or float32 sources, ZeRO-3 over every rank,
// so partitions cut blocks anywhere) into float8 targets split by rows or columns over
// every rank at random points, with padded row strides; one bfloat16 tensor beside them
// on every rank. Buffers on each rank: 0 sources, 1 float8 targets, 2 scales, 3 the
// bfloat16 target.
struct QuantizedBatch {
  planner::PlanInput input;
  std::vector<std::vector<float>> values;  // per tensor, row-major, as sent (bfloat16-exact)
};

QuantizedBatch RandomQuantizedBatch(std::mt19937_64& rng, int ranks) {
  QuantizedBatch batch;
  std::vector<int32_t> all(ranks);
  for (int r = 0; r < ranks; ++r) all[r] = r;
  const int tensors = 2 + static_cast<int>(rng() % 3);
  const std::vector<int64_t> extents{1, 7, 128, 200, 256, 300};
  std::vector<int64_t> numels, target_bytes(ranks, 0), scale_elements(ranks, 0);
  const DType source_dtype = rng() % 2 == 0 ? DType::kBFloat16 : DType::kFloat32;
  for (int t = 0; t < tensors; ++t) {
    planner::TensorLayouts layouts;
    layouts.name = absl::StrCat("q", t);
    const int64_t rows = extents[rng() % extents.size()], cols = extents[rng() % extents.size()];
    layouts.shape = Index{rows, cols};
    layouts.source_dtype = source_dtype;
    layouts.target_dtype = DType::kFloat8E4M3;
    numels.push_back(rows * cols);
    const int axis = static_cast<int>(rng() % 2);
    std::vector<int64_t> cuts{0, layouts.shape[axis]};
    for (int r = 1; r < ranks; ++r) cuts.push_back(static_cast<int64_t>(rng() % (layouts.shape[axis] + 1)));
    std::sort(cuts.begin(), cuts.end());
    for (int r = 0; r < ranks; ++r) {
      planner::Box box{{0, 0}, {rows, cols}};
      box.lo[axis] = cuts[r];
      box.hi[axis] = cuts[r + 1];
      const int64_t shard_rows = box.hi[0] - box.lo[0], shard_cols = box.hi[1] - box.lo[1];
      const int64_t row_stride = shard_cols + static_cast<int64_t>(rng() % 3);
      layouts.target.placements.push_back({box, Holder{r, 1}, target_bytes[r], Index{row_stride, 1}});
      target_bytes[r] += shard_rows * row_stride;
      const int64_t scale_stride = planner::ScaleBlocks(shard_cols) + static_cast<int64_t>(rng() % 2);
      layouts.target_scales.push_back({Holder{r, 2}, scale_elements[r], scale_stride});
      scale_elements[r] += planner::ScaleBlocks(shard_rows) * scale_stride;
    }
    std::vector<float> values(rows * cols);
    std::uniform_int_distribution<int> exponent(-135, 15);
    std::uniform_real_distribution<float> unit(-1, 1);
    const int e = exponent(rng);
    const bool zero = rng() % 4 == 0;
    for (float& v : values) {
      const float x = zero || rng() % 8 == 0 ? 0.0f : std::ldexp(unit(rng), e + static_cast<int>(rng() % 3));
      v = testing::BFloat16Value(testing::Float32ToBFloat16(absl::bit_cast<uint32_t>(x)));
    }
    batch.values.push_back(std::move(values));
    batch.input.tensors.push_back(std::move(layouts));
  }
  const std::vector<int64_t> offsets = planner::Zero3Offsets(numels, ranks);
  for (int t = 0; t < tensors; ++t) {
    batch.input.tensors[t].source = planner::Zero3(batch.input.tensors[t].shape, all, 0, offsets[t]);
  }
  planner::TensorLayouts plain;
  plain.name = "plain";
  plain.shape = Index{100};
  plain.source_dtype = plain.target_dtype = DType::kBFloat16;
  plain.source = planner::Replicated(plain.shape, all, 4, std::vector<int64_t>(ranks, 0));
  plain.target = planner::Replicated(plain.shape, all, 3, std::vector<int64_t>(ranks, 0));
  batch.input.tensors.push_back(plain);
  for (int r = 0; r < ranks; ++r) {
    batch.input.buffers.push_back({Holder{r, 0}, offsets.back() * planner::ElementBytes(source_dtype), "source"});
    batch.input.buffers.push_back({Holder{r, 1}, target_bytes[r], "float8"});
    batch.input.buffers.push_back({Holder{r, 2}, 4 * scale_elements[r], "scales"});
    batch.input.buffers.push_back({Holder{r, 3}, 200, "bfloat16"});
    batch.input.buffers.push_back({Holder{r, 4}, 200, "plain source"});
  }
  return batch;
}

// Writes each tensor's values into its source placements (as their dtype).
void WriteSources(const QuantizedBatch& batch, testing::HostBuffers& buffers) {
  for (size_t t = 0; t + 1 < batch.input.tensors.size(); ++t) {
    const planner::TensorLayouts& layouts = batch.input.tensors[t];
    const int64_t element = planner::ElementBytes(layouts.source_dtype);
    for (const planner::Placement& p : layouts.source.placements) {
      for (int64_t r = p.box.lo[0]; r < p.box.hi[0]; ++r) {
        for (int64_t c = p.box.lo[1]; c < p.box.hi[1]; ++c) {
          const float v = batch.values[t][r * layouts.shape[1] + c];
          uint8_t* at = buffers.at(p.holder).data() +
                        (p.base + (r - p.box.lo[0]) * p.strides[0] + (c - p.box.lo[1]) * p.strides[1]) * element;
          const uint32_t bits = absl::bit_cast<uint32_t>(v);
          if (element == 4) {
            std::memcpy(at, &bits, 4);
          } else {
            const uint16_t half = static_cast<uint16_t>(bits >> 16);
            std::memcpy(at, &half, 2);
          }
        }
      }
    }
  }
}

// Every float8 element and scale of every target placement as the oracle quantizes the
// placement's own 128 x 128 blocks; the first mismatch, described, or empty.
std::string CheckQuantized(const QuantizedBatch& batch, const testing::HostBuffers& buffers) {
  for (size_t t = 0; t + 1 < batch.input.tensors.size(); ++t) {
    const planner::TensorLayouts& layouts = batch.input.tensors[t];
    for (size_t i = 0; i < layouts.target.placements.size(); ++i) {
      const planner::Placement& p = layouts.target.placements[i];
      const planner::BlockScales& scales = layouts.target_scales[i];
      for (int64_t br = p.box.lo[0]; br < p.box.hi[0]; br += 128) {
        for (int64_t bc = p.box.lo[1]; bc < p.box.hi[1]; bc += 128) {
          const int64_t r_end = std::min(p.box.hi[0], br + 128), c_end = std::min(p.box.hi[1], bc + 128);
          float amax = 0;
          for (int64_t r = br; r < r_end; ++r) {
            for (int64_t c = bc; c < c_end; ++c)
              amax = std::max(amax, std::fabs(batch.values[t][r * layouts.shape[1] + c]));
          }
          const float scale = testing::ReferenceBlockScale(amax);
          float got;
          std::memcpy(&got,
                      buffers.at(scales.holder).data() +
                          4 * (scales.base + (br - p.box.lo[0]) / 128 * scales.row_stride + (bc - p.box.lo[1]) / 128),
                      4);
          if (absl::bit_cast<uint32_t>(got) != absl::bit_cast<uint32_t>(scale)) {
            return absl::StrCat(layouts.name, " on rank ", p.holder.rank, ": scale of block at ", br, ", ", bc, " is ",
                                got, ", not ", scale);
          }
          for (int64_t r = br; r < r_end; ++r) {
            for (int64_t c = bc; c < c_end; ++c) {
              const uint8_t expected = testing::NearestFloat8E4M3(batch.values[t][r * layouts.shape[1] + c] / scale);
              const uint8_t value = buffers.at(p.holder)[p.base + (r - p.box.lo[0]) * p.strides[0] + (c - p.box.lo[1])];
              if (value != expected) {
                return absl::StrCat(layouts.name, " on rank ", p.holder.rank, ": element ", r, ", ", c, " is ", value,
                                    ", not ", expected);
              }
            }
          }
        }
      }
    }
  }
  return "";
}

TEST_CASE("block-quantized targets: every rank's engine quantizes what ZeRO-3 partitions sent, bit for bit") {
  const auto policy = planner::LocalFirstLeastLoaded();
  int grouped = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    const int ranks = 2 + static_cast<int>(seed % 3);
    const QuantizedBatch batch = RandomQuantizedBatch(rng, ranks);
    // One group, or the least scratch that holds the largest tensor on a rank: a group
    // for about every tensor.
    int64_t least = 0;
    for (const planner::TensorLayouts& t : batch.input.tensors) {
      std::map<int32_t, int64_t> need;
      for (const planner::Placement& p : t.target.placements) {
        need[p.holder.rank] += (planner::NumElements(planner::Extent(p.box)) + 127) / 128 * 128 * 2;
      }
      for (const auto& [rank, bytes] : need) least = std::max(least, bytes);
    }
    planner::PlanOptions options;
    options.scratch_bytes = seed % 2 == 0 ? int64_t{1} << 20 : least;
    auto plan = planner::MakePlan(batch.input, *policy, options);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    grouped += plan->stages > 1;
    const int64_t budget = std::vector<int64_t>{64, 4096}[seed % 2];
    auto schedules = planner::MakeSchedules(*plan, budget);
    REQUIRE(schedules.ok());
    // Every link direct in a third of the batches, a mix of direct and staged links in the rest.
    const auto direct = [seed](int32_t a, int32_t b) { return seed % 3 == 0 || (a + b + seed) % 2 == 0; };
    INFO("seed " << seed << " ranks " << ranks << " stages " << plan->stages);
    testing::HostBuffers buffers = testing::AllocateBuffers(batch.input);
    for (auto& [holder, bytes] : buffers) {
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());  // poison
    }
    for (const planner::Buffer& b : plan->scratch) buffers[b.holder].assign(b.bytes, 0xff);
    WriteSources(batch, buffers);
    std::vector<uint8_t> plain(200);
    for (uint8_t& b : plain) b = static_cast<uint8_t>(rng());
    for (int r = 0; r < ranks; ++r) std::memcpy(buffers.at(Holder{r, 4}).data(), plain.data(), 200);
    std::set<int32_t> every;
    for (int32_t r = 0; r < ranks; ++r) every.insert(r);
    const auto results = RunEveryRankDirect(*plan, *schedules, buffers, budget, direct, every);
    int64_t quantized = 0;
    for (int32_t r = 0; r < ranks; ++r) {
      REQUIRE(results[r].ok());
      quantized += results[r]->quantized_bytes;
    }
    int64_t elements = 0;
    for (size_t t = 0; t + 1 < batch.input.tensors.size(); ++t)
      elements += static_cast<int64_t>(batch.values[t].size());
    CHECK(quantized == elements);
    const std::string error = CheckQuantized(batch, buffers);
    INFO(error);
    CHECK(error.empty());
    for (int r = 0; r < ranks; ++r) CHECK(std::memcmp(buffers.at(Holder{r, 3}).data(), plain.data(), 200) == 0);
  }
  CHECK(grouped >= 25);
}

}  // namespace
}  // namespace shardsync::executor

// Property tests: many seeded random layouts planned, scheduled and applied by the
// host reference executor; every target element must equal its source, bit for bit.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <random>

#include "planner/cost.h"
#include "planner/digest.h"
#include "planner/model_layout.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "planner/schedule.h"
#include "tests/planner/random_layouts.h"
#include "tests/planner/reference_executor.h"
#include "tests/planner/sync_check.h"

namespace shardsync::testing {
namespace {

// From exactly one element of the widest dtype the batch moves, to unbounded.
int64_t RandomBudget(const planner::PlanInput& input, std::mt19937_64& rng) {
  int64_t element = 1;
  for (const planner::TensorLayouts& t : input.tensors)
    element = std::max(element, planner::ElementBytes(t.target_dtype));
  const int64_t options[] = {planner::kStagingBuffersPerPeer * element,
                             planner::kStagingBuffersPerPeer * element * 3 / 2, 64, 1000, int64_t{1} << 40};
  return options[rng() % 5];
}

// Plans, schedules and runs `input`; checks every element and the accounting.
void SyncAndCheck(const planner::PlanInput& input, const planner::ReplicaPolicy& policy, int64_t budget,
                  std::mt19937_64& rng) {
  auto plan = planner::MakePlan(input, policy);
  REQUIRE(plan.ok());
  auto schedules = planner::MakeSchedules(*plan, budget);
  REQUIRE(schedules.ok());
  const planner::PlanStats stats = planner::ComputeStats(*plan, *schedules);

  HostBuffers buffers = AllocateBuffers(input);
  const TensorValues values = PrepareBuffers(input, rng, buffers);
  const HostBuffers before = buffers;
  auto executed = Execute(*plan, *schedules, budget, buffers);
  REQUIRE(executed.ok());

  const std::vector<std::string> errors = CheckSync(input, values, before, buffers);
  INFO((errors.empty() ? std::string() : errors.front()));
  CHECK(errors.empty());
  CHECK(executed->peak_staging_bytes <= budget);
  CHECK(executed->sent_bytes == stats.total_sent_bytes);
  CHECK(executed->local_bytes == stats.total_local_bytes);
  CHECK(executed->rounds == stats.rounds);
  int64_t received = 0;
  for (const planner::RankStats& r : stats.ranks) received += r.received_bytes;
  CHECK(received == stats.total_sent_bytes);
}

TEST_CASE("random ZeRO-1/2/3 models sync bit for bit into random TP replicas") {
  const auto least_loaded = planner::LocalFirstLeastLoaded();
  const auto first_holder = planner::FirstHolder();
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    std::mt19937_64 rng(seed);
    const planner::ModelLayoutSpec spec = RandomModel(rng);
    INFO("seed " << seed << ", zero stage " << spec.zero_stage << ", " << spec.tensors.size() << " tensors, "
                 << spec.replicas.size() << " replicas");
    auto input = planner::ExpandModel(spec);
    REQUIRE(input.ok());
    const planner::ReplicaPolicy& policy = seed % 4 == 0 ? *first_holder : *least_loaded;
    SyncAndCheck(*input, policy, RandomBudget(*input, rng), rng);
  }
}

TEST_CASE("random sources with different boundaries sync bit for bit") {
  const auto policy = planner::LocalFirstLeastLoaded();
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 rng(seed * 7919);
    INFO("seed " << seed);
    const planner::PlanInput input = RandomMixedSources(rng);
    SyncAndCheck(input, *policy, RandomBudget(input, rng), rng);
  }
}

TEST_CASE("under ZeRO-1/2 with TP targets on the same ranks no byte crosses ranks") {
  const auto policy = planner::LocalFirstLeastLoaded();
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    std::mt19937_64 rng(seed);
    planner::ModelLayoutSpec spec = RandomModel(rng);
    spec.zero_stage = 1 + static_cast<int>(seed % 2);
    spec.dp_ranks.clear();
    for (const auto& ranks : spec.replicas) {
      for (int32_t r : ranks) {
        if (std::find(spec.dp_ranks.begin(), spec.dp_ranks.end(), r) == spec.dp_ranks.end()) spec.dp_ranks.push_back(r);
      }
    }
    INFO("seed " << seed);
    auto input = planner::ExpandModel(spec);
    REQUIRE(input.ok());
    auto plan = planner::MakePlan(*input, *policy);
    REQUIRE(plan.ok());
    auto schedules = planner::MakeSchedules(*plan, 1 << 20);
    REQUIRE(schedules.ok());
    const planner::PlanStats stats = planner::ComputeStats(*plan, *schedules);
    CHECK(stats.total_sent_bytes == 0);
    CHECK(stats.total_local_bytes > 0);
  }
}

TEST_CASE("a streamed plan is the whole plan, one tensor at a time, for random models with and without relay") {
  const auto policy = planner::LocalFirstLeastLoaded();
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    auto input = planner::ExpandModel(RandomModel(rng));
    REQUIRE(input.ok());
    const bool relay = seed % 2 == 0;
    if (relay) PlaceOnRandomNodes(*input, 2 + seed % 3, rng);
    INFO("seed " << seed);
    auto whole = planner::MakePlan(*input, *policy, planner::PlanOptions{relay});
    REQUIRE(whole.ok());
    size_t at = 0;
    int32_t last_tensor = -1;
    bool one_tensor_each = true, same = true;
    planner::StreamedStageBytes bytes(*input);
    auto streamed =
        planner::StreamPlan(*input, *policy, planner::PlanOptions{relay}, [&](absl::Span<const planner::Segment> made) {
          bytes.Add(made);
          for (const planner::Segment& s : made) {
            one_tensor_each = one_tensor_each && s.tensor == made.front().tensor && s.tensor > last_tensor;
            same = same && at < whole->segments.size() &&
                   std::memcmp(&s, &whole->segments[at], sizeof(planner::Segment)) == 0;
            ++at;
          }
          if (!made.empty()) last_tensor = made.front().tensor;
          return absl::OkStatus();
        });
    REQUIRE(streamed.ok());
    CHECK(one_tensor_each);
    CHECK(same);
    CHECK(at == whole->segments.size());
    CHECK(streamed->segments.size() == 0);
    CHECK(streamed->stages == whole->stages);
    CHECK(streamed->fills.size() == whole->fills.size());
    CHECK(streamed->quantizes.size() == whole->quantizes.size());
    // Its bytes per stage and rank, counted as it streamed, are the whole plan's.
    CHECK(bytes.segments() == static_cast<int64_t>(whole->segments.size()));
    const auto fields = [](const planner::RankStats& r) {
      return std::vector<int64_t>{
          r.sent_bytes,         r.received_bytes,         r.local_bytes,   r.fill_bytes,     r.segments,
          r.network_sent_bytes, r.network_received_bytes, r.relayed_bytes, r.quantized_bytes};
    };
    const auto expected = planner::StageBytes(*whole);
    const auto counted = bytes.Finish(*streamed);
    REQUIRE(counted.size() == expected.size());
    for (size_t stage = 0; stage < expected.size(); ++stage) {
      REQUIRE(counted[stage].size() == expected[stage].size());
      for (size_t r = 0; r < expected[stage].size(); ++r)
        CHECK(fields(counted[stage][r]) == fields(expected[stage][r]));
    }
  }
}

// A schedule as numbers, each segment index replaced by `renumber` of it: two schedules
// of one rank compare equal when they move the same segments in the same chunks.
std::vector<int64_t> Flatten(const planner::Schedule& schedule, const std::function<int64_t(int32_t)>& renumber) {
  std::vector<int64_t> out{schedule.rank, schedule.scratch_handoff};
  for (int32_t f : schedule.fills) out.push_back(f);
  for (const planner::Stage& stage : schedule.stages) {
    out.insert(out.end(), {-1, stage.rounds, stage.first_round});
    for (int32_t i : stage.local_segments) out.push_back(renumber(i));
    for (int32_t q : stage.quantizes) out.push_back(q);
    for (const auto* streams : {&stage.sends, &stage.receives}) {
      out.push_back(-2);
      for (const planner::PeerStream& stream : *streams) {
        out.insert(out.end(), {stream.peer, stream.bytes});
        for (int32_t i : stream.segments) out.push_back(renumber(i));
        for (const planner::Chunk& c : stream.chunks)
          out.insert(out.end(), {c.first, c.last, c.first_begin, c.last_end, c.bytes});
      }
    }
  }
  return out;
}

TEST_CASE("a plan streamed through PlanStreamed has the whole plan's stats, digest and each rank's schedule") {
  const auto policy = planner::LocalFirstLeastLoaded();
  int quantized = 0, compared_relay = 0, relayed = 0;  // seeds that tried each
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    std::mt19937_64 rng(seed);
    planner::ModelLayoutSpec spec = RandomModel(rng);
    if (seed % 5 == 0) {  // float8 targets, from bfloat16 sources
      spec.target_dtype = planner::DType::kFloat8E4M3;
      for (planner::ModelTensor& t : spec.tensors) t.dtype = planner::DType::kBFloat16;
    }
    auto input = planner::ExpandModel(spec);
    REQUIRE(input.ok());
    const planner::RelayMode mode = seed % 3 == 0   ? planner::RelayMode::kAuto
                                    : seed % 3 == 1 ? planner::RelayMode::kAlways
                                                    : planner::RelayMode::kNever;
    if (seed % 2 == 0) PlaceOnRandomNodes(*input, 2 + seed % 3, rng);
    const int64_t budget = RandomBudget(*input, rng);
    const planner::Bandwidths bandwidths{100e9, 1000e9, seed % 4 == 0 ? 1e9 : 50e9};
    INFO("seed " << seed);
    std::pair<double, double> floors{0, 0};
    auto whole = planner::MakePlanWithRelay(*input, *policy, mode, bandwidths, &floors);
    INFO(whole.status().ToString());
    REQUIRE(whole.ok());
    whole->num_ranks += 2;  // a world past the ranks with buffers, as the coordinator's may be
    auto schedules = planner::MakeSchedules(*whole, budget);
    REQUIRE(schedules.ok());
    planner::BlockVector<planner::Segment> sunk;
    auto streamed = planner::PlanStreamed(*input, *policy, mode, bandwidths, planner::kDefaultScratchBytes, budget,
                                          whole->num_ranks, [&](absl::Span<const planner::Segment> tensor) {
                                            for (const planner::Segment& s : tensor) sunk.push_back(s);
                                            return absl::OkStatus();
                                          });
    REQUIRE(streamed.ok());
    quantized += !whole->quantizes.empty();
    compared_relay += floors.first > 0;
    relayed += whole->stages > 1 && whole->quantizes.empty();
    REQUIRE(sunk.size() == whole->segments.size());
    bool same = true;
    for (size_t i = 0; i < sunk.size(); ++i) {
      same = same && std::memcmp(&sunk[i], &whole->segments[i], sizeof(planner::Segment)) == 0;
    }
    CHECK(same);
    CHECK(streamed->plan.segments.empty());
    CHECK(streamed->plan.num_ranks == whole->num_ranks);
    CHECK(streamed->digest == planner::PlanDigest(*whole, budget));
    CHECK(streamed->floors == floors);
    const planner::PlanStats expected = planner::ComputeStats(*whole, *schedules);
    const planner::PlanStats& got = streamed->stats;
    CHECK(got.segments == expected.segments);
    CHECK(got.chunks == expected.chunks);
    CHECK(got.rounds == expected.rounds);
    CHECK(got.link_bytes == expected.link_bytes);
    CHECK(got.total_sent_bytes == expected.total_sent_bytes);
    CHECK(got.total_network_bytes == expected.total_network_bytes);
    CHECK(got.total_relayed_bytes == expected.total_relayed_bytes);
    CHECK(got.total_local_bytes == expected.total_local_bytes);
    REQUIRE(got.ranks.size() == expected.ranks.size());
    for (size_t r = 0; r < got.ranks.size(); ++r) {
      CHECK(got.ranks[r].chunks == expected.ranks[r].chunks);
      CHECK(got.ranks[r].rounds == expected.ranks[r].rounds);
      CHECK(got.ranks[r].received_bytes == expected.ranks[r].received_bytes);
    }
    // Each rank's schedule from its own segments alone is the one the whole plan gives.
    for (int32_t rank = 0; rank < whole->num_ranks; ++rank) {
      planner::BlockVector<planner::Segment> rank_segments;
      std::vector<int64_t> position(whole->segments.size(), -1);
      for (size_t i = 0; i < whole->segments.size(); ++i) {
        const planner::Segment& s = whole->segments[i];
        if (s.src.rank != rank && s.dst.rank != rank) continue;
        position[i] = static_cast<int64_t>(rank_segments.size());
        rank_segments.push_back(s);
      }
      auto schedule = planner::MakeRankSchedule(streamed->plan, rank_segments, rank, budget, streamed->first_rounds);
      REQUIRE(schedule.ok());
      CHECK(Flatten(*schedule, [](int32_t i) { return i; }) ==
            Flatten((*schedules)[rank], [&](int32_t i) { return position[i]; }));
    }
  }
  CHECK(quantized > 0);
  CHECK(compared_relay > 0);
  CHECK(relayed > 0);
}

TEST_CASE("a streamed plan refuses an uncovered box before its first tensor goes out") {
  std::mt19937_64 rng(5);
  auto input = planner::ExpandModel(RandomModel(rng));
  REQUIRE(input.ok());
  // The last tensor's sources hold only its first row: the rest has none.
  planner::TensorLayouts& last = input->tensors.back();
  REQUIRE(last.shape[0] > 1);
  for (planner::Placement& p : last.source.placements) p.box.hi[0] = std::min<int64_t>(p.box.hi[0], 1);
  int calls = 0;
  auto streamed = planner::StreamPlan(*input, *planner::LocalFirstLeastLoaded(), {}, [&](auto) {
    ++calls;
    return absl::OkStatus();
  });
  REQUIRE_FALSE(streamed.ok());
  CHECK_THAT(std::string(streamed.status().message()), Catch::Matchers::Contains("has no source"));
  CHECK(calls == 0);
}

}  // namespace
}  // namespace shardsync::testing

// Property tests: many seeded random layouts planned, scheduled and applied by the
// host reference executor; every target element must equal its source, bit for bit.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "planner/cost.h"
#include "planner/model_layout.h"
#include "planner/plan.h"
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

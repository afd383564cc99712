// The coordinator's streamed epoch against the whole plan: every rank's PrepareRequest,
// made later from that rank's segments alone, is byte for byte the one the whole plan's
// schedule encodes; the plan's file has no name and its errors name the directory.
#include "daemon/coordinator/epoch_plan.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/common/schedule_codec.h"
#include "planner/digest.h"
#include "planner/model_layout.h"
#include "planner/relay.h"
#include "planner/schedule.h"
#include "tests/planner/random_layouts.h"

namespace shardsync::coordinator {
namespace {

std::vector<std::string> BufferNames(const planner::PlanInput& input) {
  std::vector<std::string> names;
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.buffer >= static_cast<int32_t>(names.size())) names.resize(b.holder.buffer + 1);
    names[b.holder.buffer] = absl::StrCat("buffer-", b.holder.buffer);
  }
  return names;
}

TEST_CASE("every rank's schedule made from its own segments is the whole plan's, byte for byte") {
  int ranks_compared = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    planner::ModelLayoutSpec spec = testing::RandomModel(rng);
    if (seed % 4 == 0) {
      spec.target_dtype = planner::DType::kFloat8E4M3;
      for (planner::ModelTensor& t : spec.tensors) t.dtype = planner::DType::kBFloat16;
    }
    absl::StatusOr<planner::PlanInput> input = planner::ExpandModel(spec);
    REQUIRE(input.ok());
    if (seed % 2 == 1) testing::PlaceOnRandomNodes(*input, 2 + seed % 3, rng);
    EpochOptions options;
    for (const planner::Buffer& b : input->buffers)
      options.world_size = std::max(options.world_size, b.holder.rank + 2);
    options.relay = seed % 3 == 0 ? planner::RelayMode::kNever : planner::RelayMode::kAuto;
    options.bandwidths = planner::Bandwidths{100e9, 1000e9, 5e9};
    options.staging_bytes = seed % 2 == 0 ? 4096 : int64_t{1} << 20;
    options.plan_dir = std::getenv("TEST_TMPDIR");
    INFO("seed " << seed);
    const std::vector<std::string> names = BufferNames(*input);
    absl::StatusOr<EpochPlan> epoch = CompileEpoch(*input, names, options);
    REQUIRE(epoch.ok());

    absl::StatusOr<planner::Plan> whole = planner::MakePlanWithRelay(
        *input, *planner::LocalFirstLeastLoaded(), options.relay, options.bandwidths, nullptr, options.scratch_bytes);
    REQUIRE(whole.ok());
    whole->num_ranks = options.world_size;
    absl::StatusOr<std::vector<planner::Schedule>> schedules = planner::MakeSchedules(*whole, options.staging_bytes);
    REQUIRE(schedules.ok());
    CHECK(epoch->digest() == planner::PlanDigest(*whole, options.staging_bytes));
    CHECK(epoch->planned.stats.segments == static_cast<int64_t>(whole->segments.size()));
    for (int32_t rank = 0; rank < options.world_size; ++rank) {
      const absl::StatusOr<v1::PrepareRequest> request = ScheduleRequest(*epoch, rank);
      REQUIRE(request.ok());
      const v1::PrepareRequest expected = daemon::EncodeSchedule(*whole, (*schedules)[rank], names);
      CHECK(request->SerializeAsString() == expected.SerializeAsString());
      ++ranks_compared;
    }
  }
  CHECK(ranks_compared > 60);
}

TEST_CASE("the plan's file has no name, and a directory it cannot use is named") {
  const std::string dir = std::getenv("TEST_TMPDIR");
  absl::StatusOr<std::unique_ptr<SegmentSpill>> spill = SegmentSpill::Create(dir, 2);
  REQUIRE(spill.ok());
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    CHECK(entry.path().filename().string().rfind("shardsync-plan-", 0) != 0);
  }
  planner::Segment s;
  s.src.rank = 0;
  s.dst.rank = 1;
  for (size_t i = 0; i < SegmentSpill::kBlockSegments + 3; ++i) {
    s.src_base = static_cast<int64_t>(i);
    REQUIRE((*spill)->Add(absl::MakeConstSpan(&s, 1)).ok());
  }
  REQUIRE((*spill)->Finish().ok());
  for (int32_t rank : {0, 1}) {
    const absl::StatusOr<planner::BlockVector<planner::Segment>> read = (*spill)->Read(rank);
    REQUIRE(read.ok());
    REQUIRE(read->size() == SegmentSpill::kBlockSegments + 3);
    for (size_t i = 0; i < read->size(); ++i) CHECK((*read)[i].src_base == static_cast<int64_t>(i));
  }
  CHECK((*spill)->Read(2).status().code() == absl::StatusCode::kInvalidArgument);

  const absl::StatusOr<std::unique_ptr<SegmentSpill>> missing = SegmentSpill::Create(dir + "/no-such-dir", 2);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(missing.status().message()), Catch::Matchers::Contains(dir + "/no-such-dir"));
}

}  // namespace
}  // namespace shardsync::coordinator

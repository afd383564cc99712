// The agent's decoding of a schedule: what the planner made comes back the same, and a
// value the executor cannot hold is refused, never truncated.
#include <catch2/catch.hpp>

#include "daemon/common/schedule_codec.h"
#include "planner/builders.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::daemon {
namespace {

using Catch::Matchers::Contains;

// Rank 0 holds a 2-D tensor whole; rank 1 takes the second half of its columns, so
// its segment is strided on rank 0's side.
v1::PrepareRequest ScheduleOfRankOne(planner::Segment* segment) {
  planner::PlanInput input;
  for (int r = 0; r < 2; ++r) input.buffers.push_back(planner::Buffer{planner::Holder{r, 0}, 4096});
  const planner::Index shape{8, 16};
  planner::Layout source = planner::Replicated(shape, {0}, 0, {0});
  auto target = planner::TpSplit(shape, 1, {8, 8}, {1, 1}, 0, {0, 0});
  REQUIRE(target.ok());
  target->placements.erase(target->placements.begin());  // keep the columns [8, 16)
  input.tensors.push_back(planner::TensorLayouts{"w", shape, planner::DType::kBFloat16, planner::DType::kBFloat16,
                                                 source, *target});
  auto plan = planner::MakePlan(input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  REQUIRE(plan->segments.size() == 1);
  *segment = plan->segments[0];
  auto schedules = planner::MakeSchedules(*plan, 4096);
  REQUIRE(schedules.ok());
  return EncodeSchedule(*plan, (*schedules)[1], {"buffer"});
}

TEST_CASE("a decoded segment is the planned one, axes and strides included") {
  planner::Segment planned;
  const v1::PrepareRequest request = ScheduleOfRankOne(&planned);
  auto local = DecodeSchedule(request, 1);
  REQUIRE(local.ok());
  REQUIRE(local->plan.segments.size() == 1);
  const planner::Segment& s = local->plan.segments[0];
  REQUIRE(s.axes == planned.axes);
  CHECK(s.axes == 2);
  for (int k = 0; k < s.axes; ++k) {
    CHECK(s.shape[k] == planned.shape[k]);
    CHECK(s.src_strides[k] == planned.src_strides[k]);
    CHECK(s.dst_strides[k] == planned.dst_strides[k]);
  }
  CHECK(s.src_base == planned.src_base);
  CHECK(s.dst_base == planned.dst_base);
}

TEST_CASE("a segment axis or stride past 32 bits is refused, not truncated") {
  planner::Segment planned;
  const v1::PrepareRequest request = ScheduleOfRankOne(&planned);
  const int64_t past = planner::kMaxSegmentAxis + 1;
  for (int field = 0; field < 4; ++field) {
    v1::PrepareRequest bad = request;
    v1::SegmentSpec& spec = *bad.mutable_segments(0);
    if (field == 0) spec.set_shape(0, past);
    if (field == 1) spec.set_src_strides(0, past);
    if (field == 2) spec.set_dst_strides(0, past);
    if (field == 3) spec.set_src_strides(1, -1);
    auto decoded = DecodeSchedule(bad, 1);
    REQUIRE_FALSE(decoded.ok());
    CHECK_THAT(std::string(decoded.status().message()), Contains("out of range"));
  }
}

}  // namespace
}  // namespace shardsync::daemon

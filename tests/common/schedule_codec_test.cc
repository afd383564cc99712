// The agent's decoding of a schedule: what the planner made comes back the same, and a
// segment record the executor cannot use is refused with what is wrong in it.
#include "daemon/common/schedule_codec.h"

#include <catch2/catch.hpp>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "planner/builders.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::daemon {
namespace {

using Catch::Matchers::Contains;

// Rank 0 holds a 2-D tensor whole; rank 1 takes the second half of its columns, so
// its segment is strided on rank 0's side.
v1::PrepareRequest ScheduleOfRankOne(planner::Segment* segment, int32_t rank = 1) {
  planner::PlanInput input;
  for (int r = 0; r < 2; ++r) input.buffers.push_back(planner::Buffer{planner::Holder{r, 0}, 4096, ""});
  const planner::Index shape{8, 16};
  planner::Layout source = planner::Replicated(shape, {0}, 0, {0});
  auto target = planner::TpSplit(shape, 1, {8, 8}, {1, 1}, 0, {0, 0});
  REQUIRE(target.ok());
  target->placements.erase(target->placements.begin());  // keep the columns [8, 16)
  input.tensors.push_back(
      planner::TensorLayouts{"w", shape, planner::DType::kBFloat16, planner::DType::kBFloat16, source, *target});
  auto plan = planner::MakePlan(input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  REQUIRE(plan->segments.size() == 1);
  *segment = plan->segments[0];
  auto schedules = planner::MakeSchedules(*plan, 4096);
  REQUIRE(schedules.ok());
  return EncodeSchedule(*plan, (*schedules)[rank], {"buffer"});
}

// The records of a request's table, each read whole.
std::vector<SegmentRecord> RecordsOf(const v1::PrepareRequest& request) {
  std::vector<SegmentRecord> records;
  SegmentFieldsReader reader(request.segment_table());
  SegmentFields fields;
  for (int32_t i = 0; i < request.segment_count(); ++i) {
    REQUIRE(reader.Next(fields).ok());
    REQUIRE(FromFields(fields, records.emplace_back()));
  }
  REQUIRE(reader.done());
  return records;
}

// `request` with `records` as its table.
v1::PrepareRequest WithRecords(v1::PrepareRequest request, const std::vector<SegmentRecord>& records) {
  request.clear_segment_table();
  SegmentFieldsWriter writer;
  for (const SegmentRecord& r : records) writer.Append(FieldsOf(r), *request.mutable_segment_table());
  request.set_segment_count(static_cast<int32_t>(records.size()));
  return request;
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

TEST_CASE("a segment record the executor cannot use is refused, naming what is wrong") {
  planner::Segment planned;
  const v1::PrepareRequest request = ScheduleOfRankOne(&planned);
  REQUIRE(request.segment_count() == 1);
  const SegmentRecord good = RecordsOf(request)[0];
  CHECK(good.src.buffer == -1);  // rank 0's side: its agent names it
  CHECK(good.dst.buffer == 0);
  const std::vector<std::pair<std::function<void(SegmentRecord&)>, std::string>> corruptions = {
      {[](SegmentRecord& r) { r.shape[0] = -1; }, "empty axis"},
      {[](SegmentRecord& r) { r.shape[1] = 0; }, "empty axis"},
      {[](SegmentRecord& r) { r.src_strides[0] = -1; }, "stride out of range"},
      {[](SegmentRecord& r) { r.dst_strides[1] = -7; }, "stride out of range"},
      {[](SegmentRecord& r) { r.axes = 0; }, "segment record 0 of 1: a segment of 0 axes"},
      {[](SegmentRecord& r) { r.axes = planner::kMaxAxes + 1; }, "a segment of 5 axes"},
      {[](SegmentRecord& r) { r.dst.buffer = 1; }, "buffer index"},
      {[](SegmentRecord& r) { r.tensor = 1; }, "tensor index"},
      {[](SegmentRecord& r) { r.src_dtype = 200; }, "dtypes"},
      {[](SegmentRecord& r) { r.stage = 1; }, "stage 1"},
      {[](SegmentRecord& r) { r.src.rank = r.dst.rank = 3; }, "does not touch this rank"},
      {[](SegmentRecord& r) { r.src.buffer = -2; }, "buffer index"},  // a peer buffer on a source side
  };
  for (const auto& [corrupt, message] : corruptions) {
    SegmentRecord bad = good;
    corrupt(bad);
    auto decoded = DecodeSchedule(WithRecords(request, {bad}), 1);
    INFO(message);
    REQUIRE_FALSE(decoded.ok());
    CHECK_THAT(std::string(decoded.status().message()), Contains(message));
  }
  // A table that ends inside a record, holds fewer or more records than it says, or
  // says a negative count.
  const std::vector<std::pair<std::function<void(v1::PrepareRequest&)>, std::string>> tables = {
      {[](v1::PrepareRequest& r) { r.mutable_segment_table()->pop_back(); },
       "segment record 0 of 1: the bytes end inside a segment"},
      {[](v1::PrepareRequest& r) { r.set_segment_count(2); }, "segment record 1 of 2: the bytes end inside a segment"},
      {[](v1::PrepareRequest& r) { r.set_segment_count(0); }, "holds more than its 0 records"},
      {[](v1::PrepareRequest& r) { r.set_segment_count(-1); }, "segment count -1"},
      {[](v1::PrepareRequest& r) { r.mutable_segment_table()->append(1, '\x80'); }, "holds more than its 1 records"},
      {[](v1::PrepareRequest& r) {
         SegmentFields fields = FieldsOf(RecordsOf(r)[0]);
         fields[0] = int64_t{1} << 40;  // the tensor, an int32
         r.clear_segment_table();
         SegmentFieldsWriter().Append(fields, *r.mutable_segment_table());
       },
       "segment record 0 of 1: a field outside its type"},
  };
  for (const auto& [change, message] : tables) {
    v1::PrepareRequest changed = request;
    change(changed);
    auto decoded = DecodeSchedule(changed, 1);
    INFO(message);
    REQUIRE_FALSE(decoded.ok());
    CHECK_THAT(std::string(decoded.status().message()), Contains(message));
  }
}

TEST_CASE("a sender's schedule names the receiver's buffer for the direct path; a bad reference is refused") {
  planner::Segment planned;
  const v1::PrepareRequest request = ScheduleOfRankOne(&planned, /*rank=*/0);
  REQUIRE(request.peer_buffers_size() == 1);
  CHECK(request.peer_buffers(0).rank() == 1);
  CHECK(request.peer_buffers(0).name() == "buffer");
  const SegmentRecord good = RecordsOf(request)[0];
  CHECK(good.dst.buffer == -2);  // peer_buffers[0]
  auto decoded = DecodeSchedule(request, 0);
  REQUIRE(decoded.ok());
  REQUIRE(decoded->peer_buffers.size() == 1);
  CHECK(decoded->plan.segments[0].dst.buffer == static_cast<int32_t>(decoded->buffer_names.size()));
  CHECK(decoded->buffer_count() == static_cast<int32_t>(decoded->buffer_names.size()) + 1);

  SegmentRecord past = good;
  past.dst.buffer = -3;  // peer_buffers[1]: none
  auto refused = DecodeSchedule(WithRecords(request, {past}), 0);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Contains("buffer index"));
  v1::PrepareRequest other_rank = request;
  other_rank.mutable_peer_buffers(0)->set_rank(2);  // not the segment's receiver
  refused = DecodeSchedule(other_rank, 0);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Contains("buffer index"));
}

TEST_CASE("segment records read back what was written, every field, each after the one before") {
  SegmentRecord r;
  r.tensor = 7;
  r.src.rank = 1023;
  r.src.buffer = -1;
  r.dst.rank = 5;
  r.dst.buffer = 2;
  r.src_base = int64_t{1} << 40;
  r.dst_base = 123456789;
  r.src_dtype = 3;
  r.dst_dtype = 4;
  r.axes = 4;
  r.stage = 1;
  for (int k = 0; k < planner::kMaxAxes; ++k) {
    r.shape[k] = 2147483647 - k;
    r.src_strides[k] = 1000 + k;
    r.dst_strides[k] = 2000 + k;
  }
  SegmentRecord first;
  first.axes = 1;
  first.shape[0] = -2147483647 - 1;  // each field's difference from the record before: both ways, at the extremes
  first.src_base = std::numeric_limits<int64_t>::max();
  first.dst_base = std::numeric_limits<int64_t>::min();
  SegmentFields too_wide = FieldsOf(r);
  too_wide[kSegmentScalarFields] = int64_t{1} << 40;  // shape[0], an int32
  std::string table;
  SegmentFieldsWriter writer;
  writer.Append(FieldsOf(first), table);
  writer.Append(FieldsOf(r), table);
  writer.Append(too_wide, table);
  SegmentFieldsReader reader(table);
  SegmentFields fields;
  SegmentRecord back;
  REQUIRE(reader.Next(fields).ok());
  REQUIRE(FromFields(fields, back));
  CHECK(back.shape[0] == first.shape[0]);
  CHECK(back.src_base == first.src_base);
  CHECK(back.dst_base == first.dst_base);
  REQUIRE(reader.Next(fields).ok());
  REQUIRE(FromFields(fields, back));
  SegmentRecord refused;
  REQUIRE(reader.Next(fields).ok());
  CHECK_FALSE(FromFields(fields, refused));  // read whole, but not into a record
  CHECK(reader.done());
  CHECK(back.tensor == r.tensor);
  CHECK(back.src.rank == r.src.rank);
  CHECK(back.src.buffer == r.src.buffer);
  CHECK(back.dst.rank == r.dst.rank);
  CHECK(back.dst.buffer == r.dst.buffer);
  CHECK(back.src_base == r.src_base);
  CHECK(back.dst_base == r.dst_base);
  CHECK(back.src_dtype == r.src_dtype);
  CHECK(back.dst_dtype == r.dst_dtype);
  CHECK(back.axes == r.axes);
  CHECK(back.stage == r.stage);
  CHECK(back.shape == r.shape);
  CHECK(back.src_strides == r.src_strides);
  CHECK(back.dst_strides == r.dst_strides);
}

}  // namespace
}  // namespace shardsync::daemon

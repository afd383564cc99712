// One rank's schedule on the wire (PrepareRequest) and back. The coordinator encodes
// only what the rank touches, renumbered; the agent decodes it into a local plan and
// schedule for the executor, refusing any malformed message.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/common/segment_fields.h"
#include "google/protobuf/arena.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "proto/shardsync.pb.h"

namespace shardsync::daemon {

// A segment in PrepareRequest.segment_table (the proto documents each field), kept in
// segment_fields.h's format (FieldsOf, FromFields): its members are named as
// planner::Segment's, with the request's own tensor and buffer indices and v1.DType
// values.
struct SegmentRecord {
  int32_t tensor = 0;
  planner::Holder src{0, -1};
  planner::Holder dst{0, -1};
  int64_t src_base = 0;
  int64_t dst_base = 0;
  uint8_t src_dtype = 0;
  uint8_t dst_dtype = 0;
  uint8_t axes = 0;
  uint8_t stage = 0;
  std::array<int32_t, planner::kMaxAxes> shape{};
  std::array<int32_t, planner::kMaxAxes> src_strides{};
  std::array<int32_t, planner::kMaxAxes> dst_strides{};
};

// Every schedule's PrepareRequest, made on `arena`, which owns them, in the order of
// `schedules`: one pass over the plan writes each segment into the tables of its two
// ranks. `buffer_names[id]` names planner buffer id `id`; the plan's scratch buffers
// are named by the plan.
std::vector<v1::PrepareRequest*> EncodeSchedules(const planner::Plan& plan,
                                                 absl::Span<const planner::Schedule> schedules,
                                                 const std::vector<std::string>& buffer_names,
                                                 google::protobuf::Arena& arena);
// One rank's, as a message of its own (tests, seeds; it passes over the whole plan).
v1::PrepareRequest EncodeSchedule(const planner::Plan& plan, const planner::Schedule& schedule,
                                  const std::vector<std::string>& buffer_names);
// The same for a schedule of MakeRankSchedule: its segment indices are into
// `rank_segments`, read in place of `plan.segments`.
v1::PrepareRequest EncodeRankSchedule(const planner::Plan& plan,
                                      const planner::BlockVector<planner::Segment>& rank_segments,
                                      const planner::Schedule& schedule, const std::vector<std::string>& buffer_names);

// A buffer of another rank that this rank's segments write (the direct path).
struct PeerBufferName {
  int32_t rank = 0;
  std::string name;           // as registered on `rank`
  int64_t scratch_bytes = 0;  // the size of `rank`'s scratch, when this is it
};

struct LocalSchedule {
  planner::Plan plan;
  planner::Schedule schedule;
  std::vector<std::string> buffer_names;  // by the local plan's Holder::buffer id
  // The other ranks' buffers this rank's sends write, by local id - buffer_names.size()
  // (a send segment's dst.buffer; -1 where the request named none).
  std::vector<PeerBufferName> peer_buffers;
  int64_t scratch_bytes = 0;  // the scratch buffer this rank holds for the plan's quantizes
  int32_t buffer_count() const { return static_cast<int32_t>(buffer_names.size() + peer_buffers.size()); }
};

absl::StatusOr<LocalSchedule> DecodeSchedule(const v1::PrepareRequest& request, int32_t rank);

}  // namespace shardsync::daemon

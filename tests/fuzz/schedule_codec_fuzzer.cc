// Fuzz target: any bytes as the PrepareRequest an agent receives. DecodeSchedule must
// refuse what it cannot use; what it accepts must hold together (indices in range,
// segments and chunks that touch this rank), since the agent's bounds checks and the
// round engine rely on it. CheckChunks, the agent's next check, must then run on it
// without fault (sanitizers) and accept only chunks that fit one staging slot.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "daemon/common/schedule_codec.h"
#include "planner/schedule.h"

namespace {

[[noreturn]] void Finding(const char* what) {
  std::fprintf(stderr, "FINDING: DecodeSchedule accepted %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardsync;
  v1::PrepareRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const int32_t rank = size > 0 ? data[0] % 4 : 0;
  const absl::StatusOr<daemon::LocalSchedule> local = daemon::DecodeSchedule(request, rank);
  if (!local.ok()) return 0;
  const planner::Plan& plan = local->plan;
  const int32_t buffers = static_cast<int32_t>(local->buffer_names.size());
  for (const planner::Segment& s : plan.segments) {
    const auto named = [&](const planner::Holder& h) { return h.buffer >= 0 && h.buffer < buffers; };
    if ((s.src.rank == rank && !named(s.src)) || (s.dst.rank == rank && !named(s.dst))) {
      Finding("a segment whose buffer on this rank has no name");
    }
    if (s.axes < 1 || s.axes > planner::kMaxAxes) Finding("a segment with a bad axis count");
    if (s.tensor < 0 || s.tensor >= static_cast<int32_t>(plan.tensor_names.size())) Finding("a bad tensor index");
    for (int k = 0; k < s.axes; ++k) {
      if (s.shape[k] <= 0) Finding("an empty axis");
      if (s.src_strides[k] < 0 || s.dst_strides[k] < 0) Finding("a negative stride");
    }
    if (s.src.rank != rank && s.dst.rank != rank) Finding("a segment of other ranks");
  }
  const auto in_range = [&](int32_t index) { return index >= 0 && index < static_cast<int32_t>(plan.segments.size()); };
  const std::vector<planner::Stage>& stages = local->schedule.stages;
  if (stages.empty() || static_cast<int>(stages.size()) > planner::kMaxStages) Finding("a schedule without stages");
  for (size_t k = 0; k < stages.size(); ++k) {
    if (k > 0 && stages[k].first_round < stages[k - 1].first_round + stages[k - 1].rounds) {
      Finding("a stage whose rounds overlap the stage before");
    }
    for (int32_t index : stages[k].local_segments) {
      if (!in_range(index)) Finding("a local segment out of range");
      if (plan.segments[index].stage != static_cast<int8_t>(k)) Finding("a local segment in another stage");
    }
    for (const auto* streams : {&stages[k].sends, &stages[k].receives}) {
      for (const planner::PeerStream& stream : *streams) {
        for (int32_t index : stream.segments) {
          if (!in_range(index)) Finding("a stream segment out of range");
          if (plan.segments[index].stage != static_cast<int8_t>(k)) Finding("a stream segment in another stage");
        }
        for (const planner::Chunk& chunk : stream.chunks) {
          if (chunk.first < 0 || chunk.last >= static_cast<int32_t>(stream.segments.size()) ||
              chunk.first > chunk.last) {
            Finding("a chunk out of its stream");
          }
        }
      }
    }
  }
  for (const planner::Segment& s : plan.segments) {
    if (s.stage > 0 && s.src_dtype != s.dst_dtype) Finding("a relayed segment that converts");
  }
  if (planner::CheckChunks(plan, local->schedule, request.staging_bytes()).ok()) {
    for (const planner::Stage& stage : stages) {
      for (const auto* streams : {&stage.sends, &stage.receives}) {
        for (const planner::PeerStream& stream : *streams) {
          for (const planner::Chunk& chunk : stream.chunks) {
            if (chunk.bytes <= 0 || chunk.bytes > planner::MaxChunkBytes(request.staging_bytes())) {
              Finding("a chunk that does not fit one staging slot");
            }
          }
        }
      }
    }
  }
  for (int32_t index : local->schedule.fills) {
    if (index < 0 || index >= static_cast<int32_t>(plan.fills.size())) Finding("a fill out of range");
    const planner::FillOp& f = plan.fills[index];
    if (f.fill.holder.buffer < 0 || f.fill.holder.buffer >= buffers) Finding("a fill whose buffer has no name");
  }
  return 0;
}

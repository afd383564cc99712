// DecodeSchedule: a rank's PrepareRequest back into its local plan and schedule,
// every index, size and cross-reference checked.
#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/common/schedule_codec.h"
#include "spec/layout_spec.h"

namespace shardsync::daemon {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed schedule: ", what));
}

absl::StatusOr<planner::PeerStream> DecodeStream(const v1::PeerStreamSpec& in, const planner::Plan& plan) {
  planner::PeerStream stream;
  stream.peer = in.peer();
  stream.bytes = in.bytes();
  for (int32_t s : in.segments()) {
    if (s < 0 || s >= static_cast<int32_t>(plan.segments.size())) return Malformed(absl::StrCat("segment ", s));
    stream.segments.push_back(s);
  }
  for (const v1::ChunkSpec& c : in.chunks()) {
    const int32_t count = static_cast<int32_t>(stream.segments.size());
    if (c.first() < 0 || c.last() < c.first() || c.last() >= count || c.bytes() < 0 || c.first_begin() < 0 ||
        c.first_begin() > planner::SegmentElements(plan.segments[stream.segments[c.first()]]) ||
        c.last_end() > planner::SegmentElements(plan.segments[stream.segments[c.last()]])) {
      return Malformed(absl::StrCat("a chunk of the stream with rank ", in.peer(), " is out of range"));
    }
    stream.chunks.push_back(planner::Chunk{c.first(), c.last(), c.first_begin(), c.last_end(), c.bytes()});
  }
  return stream;
}

// DecodeSchedule's parts, in order, each checking what it reads: an index or size out of
// range, or a part that contradicts another, is Malformed (INVALID_ARGUMENT).
class ScheduleDecoder {
 public:
  ScheduleDecoder(const v1::PrepareRequest& request, int32_t rank) : request_(request), rank_(rank) {}

  absl::StatusOr<LocalSchedule> Decode() && {
    local_.plan.tensor_names.assign(request_.tensor_names().begin(), request_.tensor_names().end());
    SHARDSYNC_RETURN_IF_ERROR(Segments());
    SHARDSYNC_RETURN_IF_ERROR(Fills());
    SHARDSYNC_RETURN_IF_ERROR(Stages());
    SHARDSYNC_RETURN_IF_ERROR(Quantizes());
    SHARDSYNC_RETURN_IF_ERROR(PeerBuffers());
    local_.schedule.rank = rank_;
    local_.plan.num_ranks = 0;
    local_.plan.stages = request_.stages_size();
    return std::move(local_);
  }

 private:
  int32_t IdOf(const std::string& name) {
    auto [it, added] = ids_.emplace(name, static_cast<int32_t>(local_.buffer_names.size()));
    if (added) local_.buffer_names.push_back(name);
    return it->second;
  }

  // The local id of a side's buffer: -1 on the other rank's side unless it names a peer
  // buffer (kept as -2 - its index until every local buffer has its id); false when
  // this rank's side names no buffer of the request, or a peer buffer is misnamed.
  bool Named(int32_t rank_of_side, int32_t index, int32_t* id) {
    *id = -1;
    if (rank_of_side != rank_) {
      if (index >= -1) return true;
      const int64_t peer = -2 - int64_t{index};
      if (peer >= request_.peer_buffers_size() || request_.peer_buffers(peer).rank() != rank_of_side) return false;
      *id = index;
      return true;
    }
    if (index < 0 || index >= request_.buffer_names_size()) return false;
    *id = IdOf(request_.buffer_names(index));
    return true;
  }

  absl::Status Segments() {
    if (request_.segment_count() < 0) return Malformed(absl::StrCat("segment count ", request_.segment_count()));
    SegmentFieldsReader table(request_.segment_table());
    SegmentFields fields;
    SegmentRecord record;
    for (int32_t i = 0; i < request_.segment_count(); ++i) {
      const auto malformed = [&](absl::string_view why) {
        return Malformed(absl::StrCat("segment record ", i, " of ", request_.segment_count(), ": ", why));
      };
      if (absl::Status read = table.Next(fields); !read.ok()) return malformed(read.message());
      if (!FromFields(fields, record)) return malformed("a field outside its type");
      SHARDSYNC_ASSIGN_OR_RETURN(planner::Segment s, Segment(record));
      local_.plan.segments.push_back(s);
    }
    if (!table.done()) {
      return Malformed(absl::StrCat("the segment table holds more than its ", request_.segment_count(), " records"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<planner::Segment> Segment(const SegmentRecord& in) {
    planner::Segment s;
    if (in.tensor < 0 || in.tensor >= request_.tensor_names_size()) return Malformed("tensor index");
    const std::string& tensor = request_.tensor_names(in.tensor);
    if (in.axes < 1 || in.axes > planner::kMaxAxes)
      return Malformed(absl::StrCat("tensor '", tensor, "': segment axes"));
    if (in.src.rank != rank_ && in.dst.rank != rank_) return Malformed("a segment that does not touch this rank");
    if (!Named(in.src.rank, in.src.buffer, &s.src.buffer) || !Named(in.dst.rank, in.dst.buffer, &s.dst.buffer) ||
        s.src.buffer < -1) {
      return Malformed(absl::StrCat("tensor '", tensor, "': a buffer index"));
    }
    const auto dtype_of = [](uint8_t value) -> absl::StatusOr<planner::DType> {
      if (!v1::DType_IsValid(value)) return absl::InvalidArgumentError("dtype");
      return spec::ToDType(static_cast<v1::DType>(value));
    };
    const absl::StatusOr<planner::DType> src_dtype = dtype_of(in.src_dtype), dst_dtype = dtype_of(in.dst_dtype);
    if (!src_dtype.ok() || !dst_dtype.ok() || !planner::CanConvert(*src_dtype, *dst_dtype)) {
      return Malformed(absl::StrCat("tensor '", tensor, "': dtypes"));
    }
    if (in.stage >= planner::kMaxStages || in.stage >= request_.stages_size()) {
      return Malformed(absl::StrCat("tensor '", tensor, "': stage ", in.stage));
    }
    if (planner::IsRelayStage(in.stage) && in.src_dtype != in.dst_dtype) {
      return Malformed(absl::StrCat("tensor '", tensor, "': a relay converts dtypes"));
    }
    s.tensor = in.tensor;
    s.stage = static_cast<int8_t>(in.stage);
    s.src.rank = in.src.rank;
    s.dst.rank = in.dst.rank;
    s.src_base = in.src_base;
    s.dst_base = in.dst_base;
    s.src_dtype = *src_dtype;
    s.dst_dtype = *dst_dtype;
    s.axes = static_cast<int8_t>(in.axes);
    for (int k = 0; k < s.axes; ++k) {
      if (in.shape[k] <= 0) return Malformed("a segment with an empty axis");
      if (in.src_strides[k] < 0 || in.dst_strides[k] < 0) return Malformed("a segment stride out of range");
      s.shape[k] = in.shape[k];
      s.src_strides[k] = in.src_strides[k];
      s.dst_strides[k] = in.dst_strides[k];
    }
    return s;
  }

  absl::Status Fills() {
    for (const v1::FillSpec& in : request_.fills()) {
      auto dtype = spec::ToDType(in.dtype());
      if (!dtype.ok() || in.tensor() < 0 || in.tensor() >= request_.tensor_names_size() ||
          in.shape_size() != in.strides_size() || in.shape_size() > planner::kMaxAxes) {
        return Malformed("fill");
      }
      for (int k = 0; k < in.shape_size(); ++k) {
        if (in.shape(k) < 0 || in.shape(k) > planner::kMaxSegmentAxis || in.strides(k) < 0 ||
            in.strides(k) > planner::kMaxSegmentAxis) {
          return Malformed("a fill axis or stride out of range");
        }
      }
      planner::Fill fill{planner::Holder{rank_, IdOf(in.buffer())}, in.base(),
                         planner::Index(in.shape().begin(), in.shape().end()),
                         planner::Index(in.strides().begin(), in.strides().end())};
      local_.plan.fills.push_back(planner::FillOp{in.tensor(), fill, *dtype});
      local_.schedule.fills.push_back(static_cast<int32_t>(local_.plan.fills.size()) - 1);
    }
    return absl::OkStatus();
  }

  absl::Status Stages() {
    if (request_.stages_size() < 1 || request_.stages_size() > planner::kMaxStages) {
      return Malformed(absl::StrCat(request_.stages_size(), " stages"));
    }
    int32_t next_round = 0;  // where a stage may start: after every round of the one before
    for (int32_t k = 0; k < request_.stages_size(); ++k) {
      const v1::StageSpec& in = request_.stages(k);
      if (in.rounds() < 0 || in.first_round() < next_round || in.first_round() > INT32_MAX - in.rounds()) {
        return Malformed(absl::StrCat("stage ", k, " rounds"));
      }
      planner::Stage& stage = local_.schedule.stages.emplace_back();
      stage.rounds = in.rounds();
      stage.first_round = in.first_round();
      next_round = stage.first_round + stage.rounds;
      SHARDSYNC_RETURN_IF_ERROR(StageSegments(k, in, stage));
    }
    return absl::OkStatus();
  }

  // Stage `k`'s local segments and streams: each segment of that stage, with this
  // rank at the end the list says.
  absl::Status StageSegments(int32_t k, const v1::StageSpec& in_stage, planner::Stage& stage) {
    const int32_t segments = static_cast<int32_t>(local_.plan.segments.size());
    const auto of_stage = [&](int32_t index) { return local_.plan.segments[index].stage == k; };
    for (int32_t index : in_stage.local_segments()) {
      if (index < 0 || index >= segments) return Malformed("local segment index");
      const planner::Segment& s = local_.plan.segments[index];
      if (s.src.rank != rank_ || s.dst.rank != rank_) return Malformed("a local segment that is not local");
      if (!of_stage(index)) return Malformed(absl::StrCat("a local segment listed in stage ", k, " is not of it"));
      stage.local_segments.push_back(index);
    }
    for (const auto& [in, out, sending] : {std::make_tuple(&in_stage.sends(), &stage.sends, true),
                                           std::make_tuple(&in_stage.receives(), &stage.receives, false)}) {
      for (const v1::PeerStreamSpec& spec : *in) {
        SHARDSYNC_ASSIGN_OR_RETURN(auto stream, DecodeStream(spec, local_.plan));
        for (int32_t index : stream.segments) {
          const planner::Segment& s = local_.plan.segments[index];
          if ((sending ? s.src.rank : s.dst.rank) != rank_ || (sending ? s.dst.rank : s.src.rank) != stream.peer) {
            return Malformed(absl::StrCat("a segment in the stream with rank ", stream.peer, " has other ends"));
          }
          if (!of_stage(index)) return Malformed(absl::StrCat("a segment streamed in stage ", k, " is not of it"));
        }
        if (static_cast<int32_t>(stream.chunks.size()) > stage.rounds) return Malformed("more chunks than rounds");
        out->push_back(std::move(stream));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Quantizes() {
    for (const v1::QuantizeSpec& in : request_.quantizes()) {
      if (in.tensor() < 0 || in.tensor() >= request_.tensor_names_size()) return Malformed("quantize tensor index");
      const std::string& tensor = request_.tensor_names(in.tensor());
      if (in.stage() < 0 || in.stage() >= request_.stages_size()) {
        return Malformed(absl::StrCat("tensor '", tensor, "': quantize stage ", in.stage()));
      }
      if (in.rows() < 1 || in.cols() < 1 || in.rows() > planner::kMaxSegmentAxis ||
          in.cols() > planner::kMaxSegmentAxis || in.scratch_base() < 0 || in.target_base() < 0 ||
          in.scale_base() < 0 || in.target_row_stride() < in.cols() ||
          in.scale_row_stride() < planner::ScaleBlocks(in.cols()) ||
          in.target_row_stride() > planner::kMaxSegmentAxis || in.scale_row_stride() > planner::kMaxSegmentAxis) {
        return Malformed(absl::StrCat("tensor '", tensor, "': a quantize's extent, base or stride"));
      }
      planner::QuantizeOp q;
      int32_t* ids[] = {&q.scratch.buffer, &q.target.buffer, &q.scale.buffer};
      const int32_t indices[] = {in.scratch_buffer(), in.target_buffer(), in.scale_buffer()};
      for (int k = 0; k < 3; ++k) {
        if (!Named(rank_, indices[k], ids[k])) {
          return Malformed(absl::StrCat("tensor '", tensor, "': a buffer index"));
        }
      }
      q.scratch.rank = q.target.rank = q.scale.rank = rank_;
      q.tensor = in.tensor();
      q.stage = static_cast<int8_t>(in.stage());
      q.scratch_base = in.scratch_base();
      q.target_base = in.target_base();
      q.target_row_stride = in.target_row_stride();
      q.scale_base = in.scale_base();
      q.scale_row_stride = in.scale_row_stride();
      q.rows = in.rows();
      q.cols = in.cols();
      local_.schedule.stages[q.stage].quantizes.push_back(static_cast<int32_t>(local_.plan.quantizes.size()));
      local_.plan.quantizes.push_back(q);
    }
    if (request_.scratch_bytes() < 0) return Malformed("scratch bytes");
    local_.scratch_bytes = request_.scratch_bytes();
    local_.schedule.scratch_handoff = request_.scratch_handoff();
    return absl::OkStatus();
  }

  // Peer buffers take the ids after this rank's.
  absl::Status PeerBuffers() {
    const int32_t own = static_cast<int32_t>(local_.buffer_names.size());
    for (planner::Segment& s : local_.plan.segments) {
      if (s.dst.buffer < -1) s.dst.buffer = own + (-2 - s.dst.buffer);
    }
    for (const v1::PeerBuffer& peer : request_.peer_buffers()) {
      if (peer.scratch_bytes() < 0) return Malformed("a peer's scratch bytes");
      local_.peer_buffers.push_back({peer.rank(), peer.name(), peer.scratch_bytes()});
    }
    return absl::OkStatus();
  }

  const v1::PrepareRequest& request_;
  const int32_t rank_;
  LocalSchedule local_;
  std::map<std::string, int32_t> ids_;  // buffer name -> local id
};

}  // namespace

absl::StatusOr<LocalSchedule> DecodeSchedule(const v1::PrepareRequest& request, int32_t rank) {
  return ScheduleDecoder(request, rank).Decode();
}

}  // namespace shardsync::daemon

#include "daemon/common/schedule_codec.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "spec/layout_spec.h"

namespace shardsync::daemon {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed schedule: ", what));
}

// The rank's plan segments, ascending: a segment's position here is its index in the
// request.
class Renumbering {
 public:
  explicit Renumbering(const planner::Schedule& schedule) {
    for (const planner::Stage& stage : schedule.stages) {
      plan_index_.insert(plan_index_.end(), stage.local_segments.begin(), stage.local_segments.end());
      for (const auto* streams : {&stage.sends, &stage.receives}) {
        for (const planner::PeerStream& stream : *streams) {
          plan_index_.insert(plan_index_.end(), stream.segments.begin(), stream.segments.end());
        }
      }
    }
    std::sort(plan_index_.begin(), plan_index_.end());
    plan_index_.erase(std::unique(plan_index_.begin(), plan_index_.end()), plan_index_.end());
  }
  const std::vector<int32_t>& plan_segments() const { return plan_index_; }
  int32_t operator()(int32_t plan_segment) const {
    return static_cast<int32_t>(std::lower_bound(plan_index_.begin(), plan_index_.end(), plan_segment) -
                                plan_index_.begin());
  }

 private:
  std::vector<int32_t> plan_index_;
};

void EncodeStream(const planner::PeerStream& stream, const Renumbering& renumber, v1::PeerStreamSpec* out) {
  out->set_peer(stream.peer);
  out->set_bytes(stream.bytes);
  out->mutable_segments()->Reserve(static_cast<int>(stream.segments.size()));
  for (int32_t s : stream.segments) out->add_segments(renumber(s));
  for (const planner::Chunk& c : stream.chunks) {
    v1::ChunkSpec* chunk = out->add_chunks();
    chunk->set_first(c.first);
    chunk->set_last(c.last);
    chunk->set_first_begin(c.first_begin);
    chunk->set_last_end(c.last_end);
    chunk->set_bytes(c.bytes);
  }
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

void EncodeInto(const planner::Plan& plan, const planner::Schedule& schedule,
                const std::vector<std::string>& buffer_names, v1::PrepareRequest& request) {
  const Renumbering renumber(schedule);
  std::map<int32_t, int32_t> tensors;  // plan tensor -> request tensor
  const auto tensor_of = [&](int32_t t) {
    auto [it, added] = tensors.emplace(t, static_cast<int32_t>(tensors.size()));
    if (added) request.add_tensor_names(plan.tensor_names[t]);
    return it->second;
  };
  request.mutable_segments()->Reserve(static_cast<int>(renumber.plan_segments().size()));
  for (int32_t index : renumber.plan_segments()) {
    const planner::Segment& s = plan.segments[index];
    v1::SegmentSpec* out = request.add_segments();
    out->set_tensor(tensor_of(s.tensor));
    out->set_src_rank(s.src.rank);
    out->set_src_buffer(buffer_names.at(s.src.buffer));
    out->set_dst_rank(s.dst.rank);
    out->set_dst_buffer(buffer_names.at(s.dst.buffer));
    out->set_src_base(s.src_base);
    out->set_dst_base(s.dst_base);
    for (int k = 0; k < s.axes; ++k) {
      out->add_shape(s.shape[k]);
      out->add_src_strides(s.src_strides[k]);
      out->add_dst_strides(s.dst_strides[k]);
    }
    out->set_src_dtype(spec::FromDType(s.src_dtype));
    out->set_dst_dtype(spec::FromDType(s.dst_dtype));
    out->set_stage(s.stage);
  }
  for (int32_t index : schedule.fills) {
    const planner::FillOp& f = plan.fills[index];
    v1::FillSpec* fill = request.add_fills();
    fill->set_tensor(tensor_of(f.tensor));
    fill->set_buffer(buffer_names.at(f.fill.holder.buffer));
    fill->set_base(f.fill.base);
    for (int64_t v : f.fill.shape) fill->add_shape(v);
    for (int64_t v : f.fill.strides) fill->add_strides(v);
    fill->set_dtype(spec::FromDType(f.dtype));
  }
  for (const planner::Stage& stage : schedule.stages) {
    v1::StageSpec* out = request.add_stages();
    for (int32_t index : stage.local_segments) out->add_local_segments(renumber(index));
    for (const planner::PeerStream& stream : stage.sends) EncodeStream(stream, renumber, out->add_sends());
    for (const planner::PeerStream& stream : stage.receives) EncodeStream(stream, renumber, out->add_receives());
    out->set_rounds(stage.rounds);
    out->set_first_round(stage.first_round);
  }
}

}  // namespace

v1::PrepareRequest EncodeSchedule(const planner::Plan& plan, const planner::Schedule& schedule,
                                  const std::vector<std::string>& buffer_names) {
  v1::PrepareRequest request;
  EncodeInto(plan, schedule, buffer_names, request);
  return request;
}

v1::PrepareRequest* EncodeSchedule(const planner::Plan& plan, const planner::Schedule& schedule,
                                   const std::vector<std::string>& buffer_names, google::protobuf::Arena& arena) {
  auto* request = google::protobuf::Arena::CreateMessage<v1::PrepareRequest>(&arena);
  EncodeInto(plan, schedule, buffer_names, *request);
  return request;
}

absl::StatusOr<LocalSchedule> DecodeSchedule(const v1::PrepareRequest& request, int32_t rank) {
  LocalSchedule local;
  std::map<std::string, int32_t> ids;
  const auto id_of = [&](const std::string& name) {
    auto [it, added] = ids.emplace(name, static_cast<int32_t>(local.buffer_names.size()));
    if (added) local.buffer_names.push_back(name);
    return it->second;
  };
  local.plan.tensor_names.assign(request.tensor_names().begin(), request.tensor_names().end());
  const int32_t tensors = request.tensor_names_size();
  for (const v1::SegmentSpec& in : request.segments()) {
    planner::Segment s;
    if (in.tensor() < 0 || in.tensor() >= tensors) return Malformed("tensor index");
    if (in.shape_size() < 1 || in.shape_size() > planner::kMaxAxes || in.src_strides_size() != in.shape_size() ||
        in.dst_strides_size() != in.shape_size()) {
      return Malformed(absl::StrCat("tensor '", request.tensor_names(in.tensor()), "': segment axes"));
    }
    if (in.src_rank() != rank && in.dst_rank() != rank) return Malformed("a segment that does not touch this rank");
    auto src_dtype = spec::ToDType(in.src_dtype());
    auto dst_dtype = spec::ToDType(in.dst_dtype());
    if (!src_dtype.ok() || !dst_dtype.ok() || !planner::CanConvert(*src_dtype, *dst_dtype)) {
      return Malformed(absl::StrCat("tensor '", request.tensor_names(in.tensor()), "': dtypes"));
    }
    if (in.stage() < 0 || in.stage() >= planner::kMaxStages || in.stage() >= request.stages_size()) {
      return Malformed(absl::StrCat("tensor '", request.tensor_names(in.tensor()), "': stage ", in.stage()));
    }
    if (in.stage() > 0 && in.src_dtype() != in.dst_dtype()) {
      return Malformed(absl::StrCat("tensor '", request.tensor_names(in.tensor()), "': a relay converts dtypes"));
    }
    s.tensor = in.tensor();
    s.stage = static_cast<int8_t>(in.stage());
    s.src = planner::Holder{in.src_rank(), in.src_rank() == rank ? id_of(in.src_buffer()) : -1};
    s.dst = planner::Holder{in.dst_rank(), in.dst_rank() == rank ? id_of(in.dst_buffer()) : -1};
    s.src_base = in.src_base();
    s.dst_base = in.dst_base();
    s.src_dtype = *src_dtype;
    s.dst_dtype = *dst_dtype;
    s.axes = static_cast<int8_t>(in.shape_size());
    for (int k = 0; k < s.axes; ++k) {
      if (in.shape(k) <= 0) return Malformed("a segment with an empty axis");
      if (in.shape(k) > planner::kMaxSegmentAxis || in.src_strides(k) < 0 ||
          in.src_strides(k) > planner::kMaxSegmentAxis || in.dst_strides(k) < 0 ||
          in.dst_strides(k) > planner::kMaxSegmentAxis) {
        return Malformed("a segment axis or stride out of range");
      }
      s.shape[k] = static_cast<planner::SegmentAxis>(in.shape(k));
      s.src_strides[k] = static_cast<planner::SegmentAxis>(in.src_strides(k));
      s.dst_strides[k] = static_cast<planner::SegmentAxis>(in.dst_strides(k));
    }
    local.plan.segments.push_back(s);
  }
  for (const v1::FillSpec& in : request.fills()) {
    auto dtype = spec::ToDType(in.dtype());
    if (!dtype.ok() || in.tensor() < 0 || in.tensor() >= tensors || in.shape_size() != in.strides_size() ||
        in.shape_size() > planner::kMaxAxes) {
      return Malformed("fill");
    }
    for (int k = 0; k < in.shape_size(); ++k) {
      if (in.shape(k) < 0 || in.shape(k) > planner::kMaxSegmentAxis || in.strides(k) < 0 ||
          in.strides(k) > planner::kMaxSegmentAxis) {
        return Malformed("a fill axis or stride out of range");
      }
    }
    planner::Fill fill{planner::Holder{rank, id_of(in.buffer())}, in.base(),
                       planner::Index(in.shape().begin(), in.shape().end()),
                       planner::Index(in.strides().begin(), in.strides().end())};
    local.plan.fills.push_back(planner::FillOp{in.tensor(), fill, *dtype});
    local.schedule.fills.push_back(static_cast<int32_t>(local.plan.fills.size()) - 1);
  }
  if (request.stages_size() < 1 || request.stages_size() > planner::kMaxStages) {
    return Malformed(absl::StrCat(request.stages_size(), " stages"));
  }
  const int32_t segments = static_cast<int32_t>(local.plan.segments.size());
  int32_t next_round = 0;  // where a stage may start: after every round of the one before
  for (int32_t k = 0; k < request.stages_size(); ++k) {
    const v1::StageSpec& in_stage = request.stages(k);
    planner::Stage& stage = local.schedule.stages.emplace_back();
    if (in_stage.rounds() < 0 || in_stage.first_round() < next_round ||
        in_stage.first_round() > INT32_MAX - in_stage.rounds()) {
      return Malformed(absl::StrCat("stage ", k, " rounds"));
    }
    stage.rounds = in_stage.rounds();
    stage.first_round = in_stage.first_round();
    next_round = stage.first_round + stage.rounds;
    const auto of_stage = [&](int32_t index) { return local.plan.segments[index].stage == k; };
    for (int32_t index : in_stage.local_segments()) {
      if (index < 0 || index >= segments) return Malformed("local segment index");
      const planner::Segment& s = local.plan.segments[index];
      if (s.src.rank != rank || s.dst.rank != rank) return Malformed("a local segment that is not local");
      if (!of_stage(index)) return Malformed(absl::StrCat("a local segment listed in stage ", k, " is not of it"));
      stage.local_segments.push_back(index);
    }
    for (const auto& [in, out, sending] : {std::make_tuple(&in_stage.sends(), &stage.sends, true),
                                           std::make_tuple(&in_stage.receives(), &stage.receives, false)}) {
      for (const v1::PeerStreamSpec& spec : *in) {
        auto stream = DecodeStream(spec, local.plan);
        if (!stream.ok()) return stream.status();
        for (int32_t index : stream->segments) {
          const planner::Segment& s = local.plan.segments[index];
          if ((sending ? s.src.rank : s.dst.rank) != rank || (sending ? s.dst.rank : s.src.rank) != stream->peer) {
            return Malformed(absl::StrCat("a segment in the stream with rank ", stream->peer, " has other ends"));
          }
          if (!of_stage(index)) return Malformed(absl::StrCat("a segment streamed in stage ", k, " is not of it"));
        }
        if (static_cast<int32_t>(stream->chunks.size()) > stage.rounds) return Malformed("more chunks than rounds");
        out->push_back(*std::move(stream));
      }
    }
  }
  local.schedule.rank = rank;
  local.plan.num_ranks = 0;
  local.plan.stages = request.stages_size();
  return local;
}

}  // namespace shardsync::daemon

#include "daemon/common/schedule_codec.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/layout_spec.h"

namespace shardsync::daemon {
namespace {

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed schedule: ", what));
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "segment records are written in host order");

template <typename T>
char* Put(char* at, const T& value) {
  std::memcpy(at, &value, sizeof value);
  return at + sizeof value;
}
template <typename T>
const char* Get(const char* at, T& value) {
  std::memcpy(&value, at, sizeof value);
  return at + sizeof value;
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

// One request being encoded: its tensors and buffers, each named once.
class RequestEncoder {
 public:
  RequestEncoder(const planner::Plan& plan, const planner::Schedule& schedule,
                 const std::vector<std::string>& buffer_names, v1::PrepareRequest* request)
      : plan_(plan), rank_(schedule.rank), buffer_names_(buffer_names), request_(request) {
    size_t segments = 0;
    for (const planner::Stage& stage : schedule.stages) {
      segments += stage.local_segments.size();
      for (const auto* streams : {&stage.sends, &stage.receives}) {
        for (const planner::PeerStream& stream : *streams) segments += stream.segments.size();
      }
    }
    request_->mutable_segment_table()->reserve(segments * kSegmentRecordBytes);
  }
  v1::PrepareRequest& request() { return *request_; }

  // Appends the record of `s`; returns its index in the table.
  int32_t Add(const planner::Segment& s) {
    SegmentRecord r;
    r.tensor = Tensor(s.tensor);
    r.src_rank = s.src.rank;
    r.src_buffer = Buffer(s.src);
    r.dst_rank = s.dst.rank;
    r.dst_buffer = s.src.rank == rank_ && s.dst.rank != rank_ ? PeerBuffer(s.dst) : Buffer(s.dst);
    r.src_base = s.src_base;
    r.dst_base = s.dst_base;
    r.src_dtype = static_cast<uint8_t>(spec::FromDType(s.src_dtype));
    r.dst_dtype = static_cast<uint8_t>(spec::FromDType(s.dst_dtype));
    r.axes = static_cast<uint8_t>(s.axes);
    r.stage = static_cast<uint8_t>(s.stage);
    for (int k = 0; k < s.axes; ++k) {
      r.shape[k] = s.shape[k];
      r.src_strides[k] = s.src_strides[k];
      r.dst_strides[k] = s.dst_strides[k];
    }
    AppendSegmentRecord(r, *request_->mutable_segment_table());
    return records_++;
  }
  int32_t Tensor(int32_t t) {
    if (t == last_tensor_) return last_request_tensor_;  // a plan comes tensor by tensor
    auto [it, added] = tensors_.emplace(t, static_cast<int32_t>(tensors_.size()));
    if (added) request_->add_tensor_names(plan_.tensor_names[t]);
    last_tensor_ = t;
    return last_request_tensor_ = it->second;
  }
  // A buffer of this rank, named once; -1 on the other rank's side (its agent names it).
  int32_t Buffer(planner::Holder h) {
    if (h.rank != rank_) return -1;
    auto it = std::find(named_buffers_.begin(), named_buffers_.end(), h.buffer);  // a rank has a few
    if (it != named_buffers_.end()) return static_cast<int32_t>(it - named_buffers_.begin());
    named_buffers_.push_back(h.buffer);
    request_->add_buffer_names(buffer_names_.at(h.buffer));
    return static_cast<int32_t>(named_buffers_.size()) - 1;
  }
  // The other rank's buffer a segment this rank sends writes (the direct path may):
  // -2 - its index in peer_buffers, each named once.
  int32_t PeerBuffer(planner::Holder h) {
    auto it = std::find(named_peer_buffers_.begin(), named_peer_buffers_.end(), h);
    if (it == named_peer_buffers_.end()) {
      it = named_peer_buffers_.insert(named_peer_buffers_.end(), h);
      v1::PeerBuffer* peer = request_->add_peer_buffers();
      peer->set_rank(h.rank);
      peer->set_name(buffer_names_.at(h.buffer));
      for (const planner::Buffer& b : plan_.scratch) {
        if (b.holder == h) peer->set_scratch_bytes(b.bytes);
      }
    }
    return -2 - static_cast<int32_t>(it - named_peer_buffers_.begin());
  }

 private:
  const planner::Plan& plan_;
  int32_t rank_;
  const std::vector<std::string>& buffer_names_;
  v1::PrepareRequest* request_;
  int32_t records_ = 0;
  std::map<int32_t, int32_t> tensors_;  // plan tensor -> request tensor
  int32_t last_tensor_ = -1, last_request_tensor_ = -1;
  std::vector<int32_t> named_buffers_;               // plan buffer ids, by buffer_names index
  std::vector<planner::Holder> named_peer_buffers_;  // by peer_buffers index
};

void EncodeStream(const planner::PeerStream& stream, const std::vector<int32_t>& record_of, v1::PeerStreamSpec* out) {
  out->set_peer(stream.peer);
  out->set_bytes(stream.bytes);
  out->mutable_segments()->Reserve(static_cast<int>(stream.segments.size()));
  for (int32_t index : stream.segments) out->add_segments(record_of[index]);
  for (const planner::Chunk& c : stream.chunks) {
    v1::ChunkSpec* chunk = out->add_chunks();
    chunk->set_first(c.first);
    chunk->set_last(c.last);
    chunk->set_first_begin(c.first_begin);
    chunk->set_last_end(c.last_end);
    chunk->set_bytes(c.bytes);
  }
}

}  // namespace

void AppendSegmentRecord(const SegmentRecord& r, std::string& table) {
  char record[kSegmentRecordBytes];
  char* at = record;
  for (int32_t v : {r.tensor, r.src_rank, r.src_buffer, r.dst_rank, r.dst_buffer}) at = Put(at, v);
  at = Put(at, r.src_base);
  at = Put(at, r.dst_base);
  for (uint8_t v : {r.src_dtype, r.dst_dtype, r.axes, r.stage}) at = Put(at, v);
  for (const auto* axis : {&r.shape, &r.src_strides, &r.dst_strides}) {
    for (int32_t v : *axis) at = Put(at, v);
  }
  table.append(record, kSegmentRecordBytes);
}

SegmentRecord ReadSegmentRecord(absl::string_view table, size_t index) {
  SegmentRecord r;
  const char* at = table.data() + index * kSegmentRecordBytes;
  for (int32_t* v : {&r.tensor, &r.src_rank, &r.src_buffer, &r.dst_rank, &r.dst_buffer}) at = Get(at, *v);
  at = Get(at, r.src_base);
  at = Get(at, r.dst_base);
  for (uint8_t* v : {&r.src_dtype, &r.dst_dtype, &r.axes, &r.stage}) at = Get(at, *v);
  for (auto* axis : {&r.shape, &r.src_strides, &r.dst_strides}) {
    for (int32_t& v : *axis) at = Get(at, v);
  }
  return r;
}

std::vector<v1::PrepareRequest*> EncodeSchedules(const planner::Plan& plan,
                                                 absl::Span<const planner::Schedule> schedules,
                                                 const std::vector<std::string>& given_names,
                                                 google::protobuf::Arena& arena) {
  // The scratch buffers of the quantizes are the plan's own (planner/quantize.h).
  std::vector<std::string> names_with_scratch;
  const std::vector<std::string>& buffer_names = plan.scratch.empty() ? given_names : names_with_scratch;
  if (!plan.scratch.empty()) {
    names_with_scratch = given_names;
    for (const planner::Buffer& b : plan.scratch) {
      if (static_cast<int32_t>(names_with_scratch.size()) <= b.holder.buffer) {
        names_with_scratch.resize(b.holder.buffer + 1);
      }
      names_with_scratch[b.holder.buffer] = b.name;
    }
  }
  std::vector<int32_t> encoder_of(plan.num_ranks, -1);  // by rank
  std::vector<RequestEncoder> encoders;
  encoders.reserve(schedules.size());
  for (const planner::Schedule& schedule : schedules) {
    encoder_of.at(schedule.rank) = static_cast<int32_t>(encoders.size());
    encoders.emplace_back(plan, schedule, buffer_names,
                          google::protobuf::Arena::CreateMessage<v1::PrepareRequest>(&arena));
  }
  // Records in plan order: one pass over the plan, read where it lies (a rank's segments
  // are spread over all of it: fetching them rank by rank missed the cache on each).
  // A segment's record index on its sender's side and on its receiver's.
  std::vector<int32_t> sender_record(plan.segments.size(), -1), receiver_record(plan.segments.size(), -1);
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    const planner::Segment& s = plan.segments[i];
    if (const int32_t e = encoder_of[s.src.rank]; e >= 0) sender_record[i] = encoders[e].Add(s);
    if (s.dst.rank == s.src.rank) continue;  // a local copy: one record
    if (const int32_t e = encoder_of[s.dst.rank]; e >= 0) receiver_record[i] = encoders[e].Add(s);
  }
  std::vector<v1::PrepareRequest*> requests;
  for (size_t k = 0; k < schedules.size(); ++k) {
    const planner::Schedule& schedule = schedules[k];
    RequestEncoder& encoder = encoders[k];
    v1::PrepareRequest& request = encoder.request();
    for (const planner::Stage& stage : schedule.stages) {
      v1::StageSpec* out = request.add_stages();
      for (int32_t index : stage.local_segments) out->add_local_segments(sender_record[index]);
      for (const planner::PeerStream& stream : stage.sends) EncodeStream(stream, sender_record, out->add_sends());
      for (const planner::PeerStream& stream : stage.receives)
        EncodeStream(stream, receiver_record, out->add_receives());
      out->set_rounds(stage.rounds);
      out->set_first_round(stage.first_round);
    }
    for (size_t k = 0; k < schedule.stages.size(); ++k) {
      for (int32_t index : schedule.stages[k].quantizes) {
        const planner::QuantizeOp& q = plan.quantizes[index];
        v1::QuantizeSpec* out = request.add_quantizes();
        out->set_tensor(encoder.Tensor(q.tensor));
        out->set_stage(static_cast<int32_t>(k));
        out->set_scratch_buffer(encoder.Buffer(q.scratch));
        out->set_scratch_base(q.scratch_base);
        out->set_target_buffer(encoder.Buffer(q.target));
        out->set_target_base(q.target_base);
        out->set_target_row_stride(q.target_row_stride);
        out->set_scale_buffer(encoder.Buffer(q.scale));
        out->set_scale_base(q.scale_base);
        out->set_scale_row_stride(q.scale_row_stride);
        out->set_rows(q.rows);
        out->set_cols(q.cols);
      }
    }
    for (const planner::Buffer& b : plan.scratch) {
      if (b.holder.rank == schedule.rank) request.set_scratch_bytes(b.bytes);
    }
    request.set_scratch_handoff(schedule.scratch_handoff);
    for (int32_t index : schedule.fills) {
      const planner::FillOp& f = plan.fills[index];
      v1::FillSpec* fill = request.add_fills();
      fill->set_tensor(encoder.Tensor(f.tensor));
      fill->set_buffer(buffer_names.at(f.fill.holder.buffer));
      fill->set_base(f.fill.base);
      for (int64_t v : f.fill.shape) fill->add_shape(v);
      for (int64_t v : f.fill.strides) fill->add_strides(v);
      fill->set_dtype(spec::FromDType(f.dtype));
    }
    requests.push_back(&request);
  }
  return requests;
}

v1::PrepareRequest EncodeSchedule(const planner::Plan& plan, const planner::Schedule& schedule,
                                  const std::vector<std::string>& buffer_names) {
  google::protobuf::Arena arena;
  return *EncodeSchedules(plan, absl::MakeConstSpan(&schedule, 1), buffer_names, arena).front();
}

namespace {

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
    const std::string& table = request_.segment_table();
    if (table.size() % kSegmentRecordBytes != 0) {
      return Malformed(
          absl::StrCat("a segment table of ", table.size(), " bytes (records are ", kSegmentRecordBytes, ")"));
    }
    for (size_t i = 0; i < table.size() / kSegmentRecordBytes; ++i) {
      SHARDSYNC_ASSIGN_OR_RETURN(planner::Segment s, Segment(ReadSegmentRecord(table, i)));
      local_.plan.segments.push_back(s);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<planner::Segment> Segment(const SegmentRecord& in) {
    planner::Segment s;
    if (in.tensor < 0 || in.tensor >= request_.tensor_names_size()) return Malformed("tensor index");
    const std::string& tensor = request_.tensor_names(in.tensor);
    if (in.axes < 1 || in.axes > planner::kMaxAxes)
      return Malformed(absl::StrCat("tensor '", tensor, "': segment axes"));
    if (in.src_rank != rank_ && in.dst_rank != rank_) return Malformed("a segment that does not touch this rank");
    if (!Named(in.src_rank, in.src_buffer, &s.src.buffer) || !Named(in.dst_rank, in.dst_buffer, &s.dst.buffer) ||
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
    s.src.rank = in.src_rank;
    s.dst.rank = in.dst_rank;
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

#include "daemon/common/schedule_codec.h"

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/layout_spec.h"

namespace shardsync::daemon {
namespace {

// One request being encoded: its tensors and buffers, each named once.
class RequestEncoder {
 public:
  // A table is reserved for records of this many bytes, more than they mostly take (a
  // rank's segments continue each other: 15-26 bytes); pages not written stay untouched.
  static constexpr size_t kReservedRecordBytes = 32;
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
    request_->mutable_segment_table()->reserve(segments * kReservedRecordBytes);
  }
  v1::PrepareRequest& request() { return *request_; }
  int32_t records() const { return records_; }

  // Appends the record of `s`; returns its index in the table.
  int32_t Add(const planner::Segment& s) {
    SegmentRecord r;
    r.tensor = Tensor(s.tensor);
    r.src = {s.src.rank, Buffer(s.src)};
    r.dst = {s.dst.rank, s.src.rank == rank_ && s.dst.rank != rank_ ? PeerBuffer(s.dst) : Buffer(s.dst)};
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
    table_.Append(FieldsOf(r), *request_->mutable_segment_table());
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
    const auto [it, added] = named_buffers_.try_emplace(h.buffer, request_->buffer_names_size());
    if (added) request_->add_buffer_names(buffer_names_.at(h.buffer));
    return it->second;
  }
  // The other rank's buffer a segment this rank sends writes (the direct path may):
  // -2 - its index in peer_buffers, each named once.
  int32_t PeerBuffer(planner::Holder h) {
    const uint64_t key = (static_cast<uint64_t>(h.rank) << 32) | static_cast<uint32_t>(h.buffer);
    const auto [it, added] = named_peer_buffers_.try_emplace(key, request_->peer_buffers_size());
    if (added) {
      v1::PeerBuffer* peer = request_->add_peer_buffers();
      peer->set_rank(h.rank);
      peer->set_name(buffer_names_.at(h.buffer));
      for (const planner::Buffer& b : plan_.scratch) {
        if (b.holder == h) peer->set_scratch_bytes(b.bytes);
      }
    }
    return -2 - it->second;
  }

 private:
  const planner::Plan& plan_;
  int32_t rank_;
  const std::vector<std::string>& buffer_names_;
  v1::PrepareRequest* request_;
  SegmentFieldsWriter table_;
  int32_t records_ = 0;
  absl::flat_hash_map<int32_t, int32_t> tensors_;  // plan tensor -> request tensor
  int32_t last_tensor_ = -1, last_request_tensor_ = -1;
  // A rank may hold a buffer a parameter, and write thousands of its peers'.
  absl::flat_hash_map<int32_t, int32_t> named_buffers_;        // plan buffer -> buffer_names index
  absl::flat_hash_map<uint64_t, int32_t> named_peer_buffers_;  // (rank, buffer) -> peer_buffers index
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

namespace {

// EncodeSchedules into `requests`, one for each schedule.
// `segments` is read in place of `plan.segments`.
void EncodeInto(const planner::Plan& plan, const planner::BlockVector<planner::Segment>& segments,
                absl::Span<const planner::Schedule> schedules, const std::vector<std::string>& given_names,
                absl::Span<v1::PrepareRequest* const> requests) {
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
  for (size_t k = 0; k < schedules.size(); ++k) {
    encoder_of.at(schedules[k].rank) = static_cast<int32_t>(k);
    encoders.emplace_back(plan, schedules[k], buffer_names, requests[k]);
  }
  // Records in plan order: one pass over the plan, read where it lies (a rank's segments
  // are spread over all of it: fetching them rank by rank missed the cache on each).
  // A segment's record index on its sender's side and on its receiver's.
  std::vector<int32_t> sender_record(segments.size(), -1), receiver_record(segments.size(), -1);
  for (size_t i = 0; i < segments.size(); ++i) {
    const planner::Segment& s = segments[i];
    if (const int32_t e = encoder_of[s.src.rank]; e >= 0) sender_record[i] = encoders[e].Add(s);
    if (s.dst.rank == s.src.rank) continue;  // a local copy: one record
    if (const int32_t e = encoder_of[s.dst.rank]; e >= 0) receiver_record[i] = encoders[e].Add(s);
  }
  for (size_t k = 0; k < schedules.size(); ++k) {
    const planner::Schedule& schedule = schedules[k];
    RequestEncoder& encoder = encoders[k];
    v1::PrepareRequest& request = encoder.request();
    request.set_segment_count(encoder.records());
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
  }
}

}  // namespace

std::vector<v1::PrepareRequest*> EncodeSchedules(const planner::Plan& plan,
                                                 absl::Span<const planner::Schedule> schedules,
                                                 const std::vector<std::string>& buffer_names,
                                                 google::protobuf::Arena& arena) {
  std::vector<v1::PrepareRequest*> requests;
  for (size_t k = 0; k < schedules.size(); ++k) {
    requests.push_back(google::protobuf::Arena::CreateMessage<v1::PrepareRequest>(&arena));
  }
  EncodeInto(plan, plan.segments, schedules, buffer_names, requests);
  return requests;
}

v1::PrepareRequest EncodeSchedule(const planner::Plan& plan, const planner::Schedule& schedule,
                                  const std::vector<std::string>& buffer_names) {
  return EncodeRankSchedule(plan, plan.segments, schedule, buffer_names);
}

v1::PrepareRequest EncodeRankSchedule(const planner::Plan& plan,
                                      const planner::BlockVector<planner::Segment>& rank_segments,
                                      const planner::Schedule& schedule, const std::vector<std::string>& buffer_names) {
  v1::PrepareRequest request;  // its own, not an arena's: returned without a copy
  v1::PrepareRequest* const out = &request;
  EncodeInto(plan, rank_segments, absl::MakeConstSpan(&schedule, 1), buffer_names, absl::MakeConstSpan(&out, 1));
  return request;
}

}  // namespace shardsync::daemon

#include "planner/digest.h"

#include "absl/strings/str_format.h"

namespace shardsync::planner {

namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Pair(int32_t low, int32_t high) {
  return static_cast<uint32_t>(low) | (static_cast<uint64_t>(static_cast<uint32_t>(high)) << 32);
}

// Every field of a segment, two 32-bit values to a word.
template <typename Lanes>
void AddSegment(const Segment& s, Lanes& d) {
  d.Add(Pair(s.tensor, s.stage | (int32_t(s.src_dtype) << 8) | (int32_t(s.dst_dtype) << 16) | (int32_t(s.axes) << 24)));
  d.Add(Pair(s.src.rank, s.src.buffer));
  d.Add(Pair(s.dst.rank, s.dst.buffer));
  d.Add(s.src_base);
  d.Add(s.dst_base);
  for (int k = 0; k < s.axes; ++k) d.Add(Pair(s.shape[k], s.src_strides[k]));
  for (int k = 0; k < s.axes; k += 2) d.Add(Pair(s.dst_strides[k], k + 1 < s.axes ? s.dst_strides[k + 1] : 0));
}

}  // namespace

void PlanDigester::Lanes::Add(uint64_t value) {
  a_ = Mix(a_ ^ value);
  b_ = Mix(b_ + value * 0x9e3779b97f4a7c15ULL);
}

void PlanDigester::Lanes::Add(const Lanes& other) {
  Add(other.a_);
  Add(other.b_);
}

std::string PlanDigester::Lanes::Hex() const { return absl::StrFormat("%016x%016x", a_, b_); }

void PlanDigester::Add(absl::Span<const Segment> segments) {
  size_t i = 0;
  if (segments_ % 2 == 1 && i < segments.size()) AddSegment(segments[i++], odd_);
  for (; i + 1 < segments.size(); i += 2) {
    AddSegment(segments[i], even_);
    AddSegment(segments[i + 1], odd_);
  }
  if (i < segments.size()) AddSegment(segments[i], even_);
  segments_ += segments.size();
}

std::string PlanDigester::Finish(const Plan& plan, int64_t staging_bytes) const {
  Lanes d = even_;
  d.Add(odd_);
  const auto add_all = [&d](const auto& values) {
    d.Add(static_cast<uint64_t>(values.size()));
    for (int64_t v : values) d.Add(v);
  };
  for (int64_t v : {staging_bytes, int64_t{plan.num_ranks}, int64_t{plan.stages}, static_cast<int64_t>(segments_)}) {
    d.Add(v);
  }
  for (const FillOp& f : plan.fills) {
    for (int64_t v : {int64_t{f.tensor}, int64_t{f.fill.holder.rank}, int64_t{f.fill.holder.buffer}, f.fill.base,
                      int64_t(f.dtype)}) {
      d.Add(v);
    }
    add_all(f.fill.shape);
    add_all(f.fill.strides);
  }
  for (const Buffer& b : plan.scratch) {
    for (int64_t v : {int64_t{b.holder.rank}, int64_t{b.holder.buffer}, b.bytes}) d.Add(v);
  }
  for (const QuantizeOp& q : plan.quantizes) {
    for (int64_t v :
         {int64_t{q.tensor}, int64_t{q.stage}, int64_t{q.scratch.rank}, int64_t{q.scratch.buffer}, q.scratch_base,
          int64_t{q.target.rank}, int64_t{q.target.buffer}, q.target_base, q.target_row_stride, int64_t{q.scale.rank},
          int64_t{q.scale.buffer}, q.scale_base, q.scale_row_stride, q.rows, q.cols}) {
      d.Add(v);
    }
  }
  return d.Hex();
}

std::string PlanDigest(const Plan& plan, int64_t staging_bytes) {
  PlanDigester digester;
  plan.segments.ForEachBlock([&](absl::Span<const Segment> block) { digester.Add(block); });
  return digester.Finish(plan, staging_bytes);
}

}  // namespace shardsync::planner

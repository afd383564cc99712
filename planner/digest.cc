#include "planner/digest.h"

#include "absl/strings/str_format.h"

namespace shardsync::planner {

namespace {

// Two independent 64-bit lanes, each mixing one word at a time (splitmix64 finalizer).
class Digest {
 public:
  void Add(uint64_t value) {
    a_ = Mix(a_ ^ value);
    b_ = Mix(b_ + value * 0x9e3779b97f4a7c15ULL);
  }
  void Add(int64_t value) { Add(static_cast<uint64_t>(value)); }
  template <typename Values>
  void AddAll(const Values& values, size_t count) {
    Add(static_cast<uint64_t>(count));
    for (size_t k = 0; k < count; ++k) Add(static_cast<int64_t>(values[k]));
  }
  // Folds another digest in (the lanes of the odd segments).
  void Add(const Digest& other) {
    Add(other.a_);
    Add(other.b_);
  }
  std::string Hex() const { return absl::StrFormat("%016x%016x", a_, b_); }

 private:
  static uint64_t Mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  uint64_t a_ = 0xcbf29ce484222325ULL;
  uint64_t b_ = 0x84222325cbf29ce4ULL;
};

uint64_t Pair(int32_t low, int32_t high) {
  return static_cast<uint32_t>(low) | (static_cast<uint64_t>(static_cast<uint32_t>(high)) << 32);
}

// Every field of a segment, two 32-bit values to a word.
void AddSegment(const Segment& s, Digest& d) {
  d.Add(Pair(s.tensor, s.stage | (int32_t(s.src_dtype) << 8) | (int32_t(s.dst_dtype) << 16) | (int32_t(s.axes) << 24)));
  d.Add(Pair(s.src.rank, s.src.buffer));
  d.Add(Pair(s.dst.rank, s.dst.buffer));
  d.Add(s.src_base);
  d.Add(s.dst_base);
  for (int k = 0; k < s.axes; ++k) d.Add(Pair(s.shape[k], s.src_strides[k]));
  for (int k = 0; k < s.axes; k += 2) d.Add(Pair(s.dst_strides[k], k + 1 < s.axes ? s.dst_strides[k + 1] : 0));
}

}  // namespace

std::string PlanDigest(const Plan& plan, int64_t staging_bytes) {
  Digest d;
  d.Add(staging_bytes);
  d.Add(int64_t{plan.num_ranks});
  d.Add(int64_t{plan.stages});
  d.Add(static_cast<uint64_t>(plan.segments.size()));
  // Even and odd segments in separate digests: two chains of multiplies run side by side.
  Digest even = d, odd;
  const size_t n = plan.segments.size();
  for (size_t i = 0; i + 1 < n; i += 2) {
    AddSegment(plan.segments[i], even);
    AddSegment(plan.segments[i + 1], odd);
  }
  if (n % 2 == 1) AddSegment(plan.segments[n - 1], even);
  d = even;
  d.Add(odd);
  for (const FillOp& f : plan.fills) {
    for (int64_t v : {int64_t{f.tensor}, int64_t{f.fill.holder.rank}, int64_t{f.fill.holder.buffer}, f.fill.base,
                      int64_t(f.dtype)}) {
      d.Add(v);
    }
    d.AddAll(f.fill.shape, f.fill.shape.size());
    d.AddAll(f.fill.strides, f.fill.strides.size());
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

}  // namespace shardsync::planner

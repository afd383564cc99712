#include "tools/localsync/contents.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "executor/block_quantize.h"
#include "executor/host_copy.h"
#include "planner/box.h"

namespace shardsync::localsync {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The logical values of one tensor in its source dtype, element by element. Those of
// a block-quantized target are finite floats (the quantizer's domain): the top bit of
// the exponent is cleared.
class Values {
 public:
  Values(const planner::TensorLayouts& t, const SourceStep& step)
      : salt_(Mix(step.seed ^ std::hash<std::string>()(t.name))),
        base_salt_(Mix(step.base ^ std::hash<std::string>()(t.name))),
        pick_salt_(Mix(0x5eedULL ^ std::hash<std::string>()(t.name))),
        changed_(step.changed),
        bytes_(planner::ElementBytes(t.source_dtype)),
        finite_(!t.target_scales.empty()) {}
  // Element sizes divide 8, so an element's bytes lie in one hashed word.
  void Element(int64_t flat, uint8_t* out) const {
    const uint64_t i = static_cast<uint64_t>(flat * bytes_);
    // Below 1, an element takes the step's seed only if it is among the changing ones.
    const bool changes = changed_ >= 1.0 || static_cast<double>(Mix(pick_salt_ + flat)) < changed_ * 0x1p64;
    const uint64_t word = Mix((changes ? salt_ : base_salt_) + (i & ~uint64_t{7})) | 0x0101010101010101ULL;
    const uint64_t shifted = word >> (8 * (i & 7));
    std::memcpy(out, &shifted, bytes_);
    if (finite_) out[bytes_ - 1] &= 0xbf;
  }
  // The element as the receiver holds it before quantizing: bfloat16, as a float.
  float BFloat16Value(int64_t flat) const {
    uint8_t bytes[8];
    Element(flat, bytes);
    uint32_t bits = 0;
    if (bytes_ == 4) {
      std::memcpy(&bits, bytes, 4);
      bits = static_cast<uint32_t>(executor::Float32ToBFloat16(bits)) << 16;
    } else {
      uint16_t half;
      std::memcpy(&half, bytes, 2);
      bits = static_cast<uint32_t>(half) << 16;
    }
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  }

 private:
  uint64_t salt_;
  uint64_t base_salt_;
  uint64_t pick_salt_;
  double changed_;
  int64_t bytes_;
  bool finite_;
};

// Writes into `data` (the buffer `holder`) what quantizing placement `p` of `t` puts
// there: its float8 elements, or its block scales `scales`.
void ExpectQuantized(const planner::TensorLayouts& t, const Values& values, const planner::Placement& p,
                     const planner::BlockScales& scales, planner::Holder holder, std::vector<uint8_t>& data) {
  if (!(p.holder == holder) && !(scales.holder == holder)) return;
  const int64_t rows = p.box.hi[0] - p.box.lo[0], cols = p.box.hi[1] - p.box.lo[1];
  const auto value = [&](int64_t r, int64_t c) {
    return values.BFloat16Value((p.box.lo[0] + r) * t.shape[1] + p.box.lo[1] + c);
  };
  for (int64_t br = 0; br < rows; br += planner::kScaleBlock) {
    for (int64_t bc = 0; bc < cols; bc += planner::kScaleBlock) {
      const int64_t r_end = std::min(rows, br + planner::kScaleBlock),
                    c_end = std::min(cols, bc + planner::kScaleBlock);
      float amax = 0;
      for (int64_t r = br; r < r_end; ++r) {
        for (int64_t c = bc; c < c_end; ++c) amax = std::max(amax, std::fabs(value(r, c)));
      }
      const float scale = executor::BlockScale(amax);
      if (scales.holder == holder) {
        const int64_t at = scales.base + br / planner::kScaleBlock * scales.row_stride + bc / planner::kScaleBlock;
        std::memcpy(data.data() + 4 * at, &scale, 4);
      }
      if (!(p.holder == holder)) continue;
      for (int64_t r = br; r < r_end; ++r) {
        for (int64_t c = bc; c < c_end; ++c) {
          data[p.base + r * p.strides[0] + c] = executor::Float32ToFloat8E4M3(value(r, c) / scale);
        }
      }
    }
  }
}

// Calls fn(flat tensor index, buffer element offset) for every element of a placement,
// row by row along the innermost axis.
template <typename Fn>
void ForEachElement(const planner::Placement& p, const planner::Index& shape, Fn&& fn) {
  const planner::Index extent = planner::Extent(p.box);
  if (planner::NumElements(extent) == 0) return;
  if (extent.empty()) {  // a scalar
    fn(0, p.base);
    return;
  }
  const planner::Index strides = planner::ContiguousStrides(shape);
  const int last = static_cast<int>(extent.size()) - 1;
  planner::Index i(extent.size(), 0);
  while (true) {
    int64_t flat = p.box.lo[last] * strides[last], at = p.base;
    for (int k = 0; k < last; ++k) {
      flat += (p.box.lo[k] + i[k]) * strides[k];
      at += i[k] * p.strides[k];
    }
    for (int64_t j = 0; j < extent[last]; ++j) fn(flat + j * strides[last], at + j * p.strides[last]);
    int k = last - 1;
    while (k >= 0 && ++i[k] == extent[k]) i[k--] = 0;
    if (k < 0) return;
  }
}

}  // namespace

std::vector<uint8_t> PoisonedBuffer(int64_t bytes, planner::Holder holder, uint64_t poison) {
  std::vector<uint8_t> data(bytes);
  const uint64_t salt = Mix(poison ^ (static_cast<uint64_t>(holder.rank) << 32) ^ holder.buffer);
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t word = Mix(salt + i);
    std::memcpy(data.data() + i, &word, std::min<int64_t>(8, bytes - i));
  }
  return data;
}

void WriteSources(const planner::PlanInput& input, const SourceStep& step, int32_t rank,
                  const std::function<uint8_t*(planner::Holder)>& memory) {
  std::map<planner::Holder, bool> poisoned;
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.rank != rank) continue;
    bool holds_sources = false;
    for (const planner::TensorLayouts& t : input.tensors) {
      for (const planner::Placement& p : t.source.placements) holds_sources = holds_sources || p.holder == b.holder;
    }
    if (!holds_sources) continue;
    const std::vector<uint8_t> poison = PoisonedBuffer(b.bytes, b.holder, step.seed);
    std::memcpy(memory(b.holder), poison.data(), poison.size());
  }
  for (const planner::TensorLayouts& t : input.tensors) {
    const Values values(t, step);
    const int64_t element = planner::ElementBytes(t.source_dtype);
    for (const planner::Placement& p : t.source.placements) {
      if (p.holder.rank != rank) continue;
      uint8_t* data = memory(p.holder);
      ForEachElement(p, t.shape, [&](int64_t flat, int64_t at) { values.Element(flat, data + at * element); });
    }
  }
}

std::vector<uint8_t> ExpectedTarget(const planner::PlanInput& input, const SourceStep& step, uint64_t poison,
                                    planner::Holder holder) {
  std::vector<uint8_t> data;
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder == holder) data = PoisonedBuffer(b.bytes, holder, poison);
  }
  for (const planner::TensorLayouts& t : input.tensors) {
    const Values values(t, step);
    const int64_t out = planner::ElementBytes(t.target_dtype);
    if (!t.target_scales.empty()) {
      for (size_t i = 0; i < t.target.placements.size(); ++i) {
        ExpectQuantized(t, values, t.target.placements[i], t.target_scales[i], holder, data);
      }
      continue;
    }
    for (const planner::Placement& p : t.target.placements) {
      if (!(p.holder == holder)) continue;
      ForEachElement(p, t.shape, [&](int64_t flat, int64_t at) {
        if (t.source_dtype == t.target_dtype) {
          values.Element(flat, data.data() + at * out);
          return;
        }
        uint8_t source[8];
        values.Element(flat, source);
        uint32_t bits;
        std::memcpy(&bits, source, 4);
        const uint16_t half = executor::Float32ToBFloat16(bits);
        std::memcpy(data.data() + at * out, &half, 2);
      });
    }
    for (const planner::Fill& f : t.target.fills) {
      if (!(f.holder == holder)) continue;
      const planner::Placement as_placement{planner::FullBox(f.shape), f.holder, f.base, f.strides};
      ForEachElement(as_placement, f.shape, [&](int64_t, int64_t at) { std::memset(data.data() + at * out, 0, out); });
    }
  }
  return data;
}

}  // namespace shardsync::localsync

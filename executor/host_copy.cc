#include "executor/host_copy.h"

#include <algorithm>
#include <cstring>

namespace shardsync::executor {
namespace {

using planner::DType;
using planner::ElementBytes;
using planner::Segment;

// Calls run(src_offset, dst_offset, packed_index, count) for every stretch of
// elements [begin, end) along the innermost axis; offsets in elements of each side.
template <typename Run>
void Walk(const Segment& s, int64_t begin, int64_t end, Run&& run) {
  const int last = s.axes - 1;
  int64_t index[planner::kMaxAxes];
  int64_t rest = begin;
  for (int k = last; k >= 0; --k) {
    index[k] = rest % s.shape[k];
    rest /= s.shape[k];
  }
  for (int64_t at = begin; at < end;) {
    int64_t src = s.src_base, dst = s.dst_base;
    for (int k = 0; k <= last; ++k) {
      src += index[k] * s.src_strides[k];
      dst += index[k] * s.dst_strides[k];
    }
    const int64_t count = std::min(end - at, s.shape[last] - index[last]);
    run(src, dst, at - begin, count);
    at += count;
    index[last] += count;
    for (int k = last; k > 0 && index[k] == s.shape[k]; --k) {
      index[k] = 0;
      ++index[k - 1];
    }
  }
}

// Copies `count` elements, converting float32 -> bfloat16 where the dtypes differ.
void CopyRun(const uint8_t* from, int64_t from_stride, DType from_dtype, uint8_t* to, int64_t to_stride, DType to_dtype,
             int64_t count) {
  const int64_t in = ElementBytes(from_dtype), out = ElementBytes(to_dtype);
  if (from_dtype == to_dtype) {
    if (from_stride == 1 && to_stride == 1) {
      std::memcpy(to, from, count * in);
      return;
    }
    for (int64_t i = 0; i < count; ++i) std::memcpy(to + i * to_stride * out, from + i * from_stride * in, in);
    return;
  }
  for (int64_t i = 0; i < count; ++i) {  // the one conversion the planner allows
    uint32_t bits;
    std::memcpy(&bits, from + i * from_stride * in, 4);
    const uint16_t half = Float32ToBFloat16(bits);
    std::memcpy(to + i * to_stride * out, &half, 2);
  }
}

}  // namespace

uint16_t Float32ToBFloat16(uint32_t bits) {
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

void PackHost(const Segment& s, int64_t begin, int64_t end, const uint8_t* src_buffer, uint8_t* out) {
  const int64_t in = ElementBytes(s.src_dtype), packed = ElementBytes(s.dst_dtype);
  const int64_t stride = s.src_strides[s.axes - 1];
  Walk(s, begin, end, [&](int64_t src, int64_t, int64_t index, int64_t count) {
    CopyRun(src_buffer + src * in, stride, s.src_dtype, out + index * packed, 1, s.dst_dtype, count);
  });
}

void UnpackHost(const Segment& s, int64_t begin, int64_t end, const uint8_t* in, uint8_t* dst_buffer) {
  const int64_t element = ElementBytes(s.dst_dtype);
  const int64_t stride = s.dst_strides[s.axes - 1];
  Walk(s, begin, end, [&](int64_t, int64_t dst, int64_t index, int64_t count) {
    CopyRun(in + index * element, 1, s.dst_dtype, dst_buffer + dst * element, stride, s.dst_dtype, count);
  });
}

void GatherHost(const Segment& s, int64_t begin, int64_t end, const uint8_t* dst_buffer, uint8_t* out) {
  const int64_t element = ElementBytes(s.dst_dtype);
  const int64_t stride = s.dst_strides[s.axes - 1];
  Walk(s, begin, end, [&](int64_t, int64_t dst, int64_t index, int64_t count) {
    CopyRun(dst_buffer + dst * element, stride, s.dst_dtype, out + index * element, 1, s.dst_dtype, count);
  });
}

void CopyHost(const Segment& s, const uint8_t* src_buffer, uint8_t* dst_buffer) {
  const int64_t in = ElementBytes(s.src_dtype), out = ElementBytes(s.dst_dtype);
  const int last = s.axes - 1;
  Walk(s, 0, planner::SegmentElements(s), [&](int64_t src, int64_t dst, int64_t, int64_t count) {
    CopyRun(src_buffer + src * in, s.src_strides[last], s.src_dtype, dst_buffer + dst * out, s.dst_strides[last],
            s.dst_dtype, count);
  });
}

void FillHost(const planner::FillOp& f, uint8_t* dst_buffer) {
  const Segment s = planner::FillRegion(f);  // a fill is a segment with no source: walk it as one
  const int64_t element = ElementBytes(f.dtype);
  const int64_t stride = s.dst_strides[s.axes - 1];
  Walk(s, 0, planner::SegmentElements(s), [&](int64_t, int64_t dst, int64_t, int64_t count) {
    if (stride == 1) {
      std::memset(dst_buffer + dst * element, 0, count * element);
      return;
    }
    for (int64_t i = 0; i < count; ++i) std::memset(dst_buffer + (dst + i * stride) * element, 0, element);
  });
}

bool IsContiguousRange(const Segment& s, int64_t begin, int64_t end, bool source) {
  const auto& strides = source ? s.src_strides : s.dst_strides;
  // Where the range crosses from one index of axis k to the next (it spans two blocks of
  // the axes inside k), axis k must step over exactly one block: then every inner axis
  // is packed too, and each element follows the one before it.
  int64_t block = 1;  // elements of the axes inside k
  for (int k = s.axes - 1; k >= 0; --k) {
    if (s.shape[k] != 1 && begin / block != (end - 1) / block && strides[k] != block) return false;
    block *= s.shape[k];
  }
  return true;
}

}  // namespace shardsync::executor

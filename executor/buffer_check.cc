#include "executor/buffer_check.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardsync::executor {
namespace {

// Whether a strided region of `axes` from element `base` lies in `bytes`, in elements
// of `element` bytes.
template <typename Axis>
bool Fits(int64_t base, const Axis* shape, const Axis* strides, int axes, int64_t element, int64_t bytes) {
  if (base < 0) return false;
  __int128 last = base;
  for (int k = 0; k < axes; ++k) {
    if (strides[k] < 0 || shape[k] <= 0) return false;
    last += static_cast<__int128>(shape[k] - 1) * strides[k];
  }
  return (last + 1) * element <= bytes;
}

absl::Status Outside(const std::string& tensor, const char* what, int32_t buffer,
                     absl::Span<const int64_t> buffer_bytes, absl::Span<const std::string> buffer_names) {
  const bool known = buffer >= 0 && static_cast<size_t>(buffer) < buffer_bytes.size();
  return absl::FailedPreconditionError(absl::StrCat("tensor '", tensor, "': ", what, " lies outside buffer '",
                                                    known ? buffer_names[buffer] : absl::StrCat(buffer), "' (",
                                                    known ? buffer_bytes[buffer] : 0, " bytes)"));
}

}  // namespace

absl::Status CheckRegionsFit(const planner::Plan& plan, int32_t rank, absl::Span<const int64_t> buffer_bytes,
                             absl::Span<const std::string> buffer_names) {
  const auto size_of = [&](int32_t buffer) -> int64_t {
    return buffer >= 0 && static_cast<size_t>(buffer) < buffer_bytes.size() ? buffer_bytes[buffer] : 0;
  };
  for (const planner::Segment& s : plan.segments) {
    for (bool source : {true, false}) {
      const planner::Holder holder = source ? s.src : s.dst;
      if (holder.rank != rank) continue;
      if (!Fits(source ? s.src_base : s.dst_base, s.shape.data(), (source ? s.src_strides : s.dst_strides).data(),
                s.axes, planner::ElementBytes(source ? s.src_dtype : s.dst_dtype), size_of(holder.buffer))) {
        return Outside(plan.tensor_names[s.tensor], "a segment", holder.buffer, buffer_bytes, buffer_names);
      }
    }
  }
  for (const planner::FillOp& f : plan.fills) {
    if (f.fill.holder.rank != rank) continue;
    if (!Fits(f.fill.base, f.fill.shape.data(), f.fill.strides.data(), static_cast<int>(f.fill.shape.size()),
              planner::ElementBytes(f.dtype), size_of(f.fill.holder.buffer))) {
      return Outside(plan.tensor_names[f.tensor], "a fill", f.fill.holder.buffer, buffer_bytes, buffer_names);
    }
  }
  for (const planner::QuantizeOp& q : plan.quantizes) {
    if (q.target.rank != rank) continue;
    const int64_t rows_cols[] = {q.rows, q.cols};
    const int64_t blocks[] = {planner::ScaleBlocks(q.rows), planner::ScaleBlocks(q.cols)};
    const int64_t scratch_strides[] = {q.cols, 1}, target_strides[] = {q.target_row_stride, 1},
                  scale_strides[] = {q.scale_row_stride, 1};
    const std::string& tensor = plan.tensor_names[q.tensor];
    if (!Fits(q.scratch_base, rows_cols, scratch_strides, 2, 2, size_of(q.scratch.buffer))) {
      return Outside(tensor, "a quantize's scratch", q.scratch.buffer, buffer_bytes, buffer_names);
    }
    if (!Fits(q.target_base, rows_cols, target_strides, 2, 1, size_of(q.target.buffer))) {
      return Outside(tensor, "a float8 target", q.target.buffer, buffer_bytes, buffer_names);
    }
    if (!Fits(q.scale_base, blocks, scale_strides, 2, 4, size_of(q.scale.buffer))) {
      return Outside(tensor, "a block scale", q.scale.buffer, buffer_bytes, buffer_names);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDirectWritesFit(const planner::Plan& plan, int32_t rank, absl::Span<const int32_t> direct_peers,
                                  absl::Span<const int64_t> buffer_bytes, absl::Span<const std::string> buffer_names) {
  for (const planner::Segment& s : plan.segments) {
    if (s.src.rank != rank || s.dst.rank == rank ||
        !std::binary_search(direct_peers.begin(), direct_peers.end(), s.dst.rank)) {
      continue;
    }
    const bool known = s.dst.buffer >= 0 && static_cast<size_t>(s.dst.buffer) < buffer_bytes.size();
    if (!known || !Fits(s.dst_base, s.shape.data(), s.dst_strides.data(), s.axes, planner::ElementBytes(s.dst_dtype),
                        buffer_bytes[s.dst.buffer])) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", plan.tensor_names[s.tensor], "': a direct write lies outside buffer '",
                       known ? buffer_names[s.dst.buffer] : absl::StrCat(s.dst.buffer), "' of rank ", s.dst.rank, " (",
                       known ? buffer_bytes[s.dst.buffer] : 0, " bytes)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardsync::executor

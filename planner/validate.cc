#include "planner/validate.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "planner/plan.h"
#include "planner/quantize.h"

namespace shardsync::planner {
namespace {

using Wide = __int128;  // sizes and offsets are checked in 128 bits: no overflow

absl::Status Invalid(const TensorLayouts& t, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", what));
}

// Registered buffers by holder, each with its position in `bytes`.
struct BufferTable {
  absl::flat_hash_map<uint64_t, int32_t> index;
  std::vector<int64_t> bytes;
  static uint64_t Key(Holder h) { return (static_cast<uint64_t>(h.rank) << 32) | static_cast<uint32_t>(h.buffer); }
};

// A placement or fill on one buffer: the byte interval it may touch (inside the buffer,
// so in 64 bits).
struct ByteSpan {
  int64_t first = 0;
  int64_t end = 0;
  int32_t buffer = 0;  // into BufferTable::bytes
  Holder holder;
  const TensorLayouts* tensor = nullptr;
  const char* side = "";  // source, target or fill
};

// No byte of a buffer in two spans (conservatively: their intervals): a target written
// twice, a source read while a target overwrites it, or one byte holding two source
// elements (the last two found by the fuzzer). Layouts put most buffers' spans in
// order (an arena, tensor after tensor), so the first pass over the layouts keeps only
// each buffer's running end; a second pass, run only when some buffer's spans came out
// of order, keeps that buffer's spans to sort them.
class SpanSink {
 public:
  explicit SpanSink(size_t buffers) : end_so_far_(buffers, 0), unordered_(buffers, false) {}
  void Add(const ByteSpan& span) {
    if (collecting_) {
      if (unordered_[span.buffer]) kept_.push_back(span);
    } else if (span.first < end_so_far_[span.buffer]) {
      unordered_[span.buffer] = any_unordered_ = true;
    } else {
      end_so_far_[span.buffer] = span.end;
    }
  }
  bool any_unordered() const { return any_unordered_; }
  void StartCollecting() { collecting_ = true; }
  absl::Status CheckKept() {
    std::sort(kept_.begin(), kept_.end(), [](const ByteSpan& a, const ByteSpan& b) {
      return a.holder == b.holder ? a.first < b.first : a.holder < b.holder;
    });
    for (size_t i = 1; i < kept_.size(); ++i) {
      const ByteSpan& a = kept_[i - 1];
      const ByteSpan& b = kept_[i];
      if (a.holder == b.holder && b.first < a.end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the ", a.side, " of tensor '", a.tensor->name, "' and the ", b.side, " of tensor '", b.tensor->name,
            "' overlap in buffer ", a.holder.buffer, " on rank ", a.holder.rank, " at byte ", b.first));
      }
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int64_t> end_so_far_;
  std::vector<bool> unordered_;
  bool any_unordered_ = false;
  bool collecting_ = false;
  std::vector<ByteSpan> kept_;
};

// Whether distinct elements of a region land in distinct slots: with the axes of extent
// above 1 in ascending stride, each stride passes the farthest slot the axes before it
// reach. Sufficient, and what dense and sliced layouts satisfy; an interleaving that
// happens to be one-to-one is refused too.
bool Injective(const Index& extent, const Index& strides) {
  absl::InlinedVector<std::pair<int64_t, int64_t>, kMaxAxes> axes;  // (stride, extent)
  for (size_t k = 0; k < extent.size(); ++k) {
    if (extent[k] > 1) axes.push_back({strides[k], extent[k]});
  }
  std::sort(axes.begin(), axes.end());
  Wide reach = 0;  // the farthest slot the axes so far reach
  for (const auto& [stride, size] : axes) {
    if (stride <= reach) return false;
    reach += static_cast<Wide>(size - 1) * stride;
  }
  return true;
}

// Bytes [first, end) that a strided region occupies, or an error if it leaves `buffer`.
absl::Status CheckFits(const PlanInput& input, const TensorLayouts& t, const char* side, Holder holder, int64_t base,
                       const Index& extent, const Index& strides, DType dtype, const BufferTable& buffers,
                       SpanSink& spans) {
  const auto where = [&] { return absl::StrCat(side, " in ", BufferLabel(input, holder)); };
  auto it = buffers.index.find(BufferTable::Key(holder));
  if (it == buffers.index.end()) return Invalid(t, absl::StrCat(where(), " names an unregistered buffer"));
  if (base < 0) return Invalid(t, absl::StrCat(where(), " has negative base ", base));
  if (strides.size() != extent.size()) {
    return Invalid(t, absl::StrCat(where(), " has ", strides.size(), " strides for ", extent.size(), " axes"));
  }
  Wide last = base;
  Wide volume = 1;
  for (size_t k = 0; k < extent.size(); ++k) {
    if (strides[k] < 0) return Invalid(t, absl::StrCat(where(), " has negative stride ", strides[k]));
    if (strides[k] > kMaxSegmentAxis) {
      return Invalid(t, absl::StrCat(where(), " has stride ", strides[k], " on axis ", k, "; at most ", kMaxSegmentAxis,
                                     " elements are supported"));
    }
    volume *= extent[k];
    if (extent[k] > 0) last += static_cast<Wide>(extent[k] - 1) * strides[k];
  }
  if (volume == 0) return absl::OkStatus();
  // A target written once per element: no two elements may share a slot.
  if (std::strcmp(side, "source") != 0 && !Injective(extent, strides)) {
    return Invalid(t, absl::StrCat(where(), " maps two elements to one place (strides ", IndexToString(strides),
                                   " over extent ", IndexToString(extent), ")"));
  }
  const Wide element = ElementBytes(dtype);
  const Wide end = (last + 1) * element;
  const int64_t size = buffers.bytes[it->second];
  if (end > size) {
    return Invalid(t, absl::StrCat(where(), " needs ", static_cast<int64_t>(std::min<Wide>(end, INT64_MAX)),
                                   " bytes but the buffer has ", size));
  }
  spans.Add(ByteSpan{base * static_cast<int64_t>(element), static_cast<int64_t>(end), it->second, holder, &t, side});
  return absl::OkStatus();
}

absl::Status CheckPlacements(const PlanInput& input, const TensorLayouts& t, const Layout& layout, const char* side,
                             DType dtype, const BufferTable& buffers, SpanSink& spans) {
  for (const Placement& p : layout.placements) {
    if (p.box.lo.size() != t.shape.size() || p.box.hi.size() != t.shape.size()) {
      return Invalid(t, absl::StrCat(side, " box on rank ", p.holder.rank, " has ", p.box.lo.size(),
                                     " axes; the tensor has ", t.shape.size()));
    }
    for (size_t k = 0; k < t.shape.size(); ++k) {
      if (p.box.lo[k] < 0 || p.box.lo[k] > p.box.hi[k] || p.box.hi[k] > t.shape[k]) {
        return Invalid(t, absl::StrCat(side, " box ", BoxToString(p.box), " on rank ", p.holder.rank,
                                       " lies outside the tensor shape ", IndexToString(t.shape)));
      }
    }
    SHARDSYNC_RETURN_IF_ERROR(
        CheckFits(input, t, side, p.holder, p.base, Extent(p.box), p.strides, dtype, buffers, spans));
  }
  return absl::OkStatus();
}

// A block-quantized target (planner/quantize.h): two axes, columns contiguous, no
// fills, and per placement its scales on its rank, inside their buffer.
absl::Status CheckQuantized(const PlanInput& input, const TensorLayouts& t, const BufferTable& buffers,
                            SpanSink& spans) {
  if (t.target_scales.empty()) return absl::OkStatus();
  if (t.target_dtype != DType::kFloat8E4M3) {
    return Invalid(t, absl::StrCat("block scales are given for a ", DTypeName(t.target_dtype),
                                   " target; only float8_e4m3 targets are block-quantized"));
  }
  if (t.shape.size() != 2) return Invalid(t, "a block-quantized target has two axes");
  if (!t.target.fills.empty()) return Invalid(t, "a block-quantized target cannot hold zero fills");
  if (t.target_scales.size() != t.target.placements.size()) {
    return Invalid(t, absl::StrCat(t.target.placements.size(), " target placements but ", t.target_scales.size(),
                                   " sets of block scales"));
  }
  for (size_t i = 0; i < t.target_scales.size(); ++i) {
    const Placement& p = t.target.placements[i];
    const BlockScales& scales = t.target_scales[i];
    const Index extent = Extent(p.box);
    if (extent[1] > 1 && p.strides[1] != 1) {
      return Invalid(t, absl::StrCat("the quantized target in ", BufferLabel(input, p.holder), " has column stride ",
                                     p.strides[1], "; its columns must be contiguous"));
    }
    if (scales.holder.rank != p.holder.rank) {
      return Invalid(
          t, absl::StrCat("the scales of the target on rank ", p.holder.rank, " are on rank ", scales.holder.rank));
    }
    const Index blocks{ScaleBlocks(extent[0]), ScaleBlocks(extent[1])};
    if (scales.row_stride < blocks[1]) {
      return Invalid(t, absl::StrCat("the scales in ", BufferLabel(input, scales.holder), " have row stride ",
                                     scales.row_stride, " for ", blocks[1], " blocks per row"));
    }
    SHARDSYNC_RETURN_IF_ERROR(CheckFits(input, t, "block scales", scales.holder, scales.base, blocks,
                                        Index{scales.row_stride, 1}, DType::kFloat32, buffers, spans));
  }
  return absl::OkStatus();
}

// Same dtypes, float32 -> bfloat16, or bfloat16 or float32 into a block-quantized target.
bool CanMove(const TensorLayouts& t) {
  if (!t.target_scales.empty()) {
    return t.source_dtype == DType::kBFloat16 || t.source_dtype == DType::kFloat32;
  }
  return CanConvert(t.source_dtype, t.target_dtype);
}

}  // namespace

absl::Status ValidateShape(absl::string_view tensor, const Index& shape) {
  const auto invalid = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor, "': ", what));
  };
  if (shape.size() > static_cast<size_t>(kMaxAxes)) {
    return invalid(absl::StrCat("has ", shape.size(), " axes; at most ", kMaxAxes, " are supported"));
  }
  Wide numel = 1;
  for (int64_t s : shape) {
    if (s < 0) return invalid(absl::StrCat("has a negative extent in shape ", IndexToString(shape)));
    if (s > kMaxSegmentAxis) {
      return invalid(absl::StrCat("has an axis of ", s, " elements in shape ", IndexToString(shape), "; at most ",
                                  kMaxSegmentAxis, " are supported"));
    }
    numel *= s;
    if (numel > (Wide{1} << 62))
      return invalid(absl::StrCat("shape ", IndexToString(shape), " has more than 2^62 elements"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePlanInput(const PlanInput& input) {
  for (size_t r = 0; r < input.node_of_rank.size(); ++r) {
    if (input.node_of_rank[r] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " has a negative node index"));
    }
  }
  BufferTable buffers;
  for (const Buffer& b : input.buffers) {
    if (b.holder.rank < 0 || b.holder.buffer < 0 || b.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(BufferLabel(input, b.holder), " has a negative rank, id or size (", b.bytes, " bytes)"));
    }
    if (b.holder.rank >= kMaxWorld) {
      return absl::InvalidArgumentError(absl::StrCat(BufferLabel(input, b.holder), " is on rank ", b.holder.rank,
                                                     ", outside the ", kMaxWorld, " ranks one coordinator serves"));
    }
    if (!input.node_of_rank.empty() && b.holder.rank >= static_cast<int32_t>(input.node_of_rank.size())) {
      return absl::InvalidArgumentError(absl::StrCat(BufferLabel(input, b.holder), " has no node (nodes are given for ",
                                                     input.node_of_rank.size(), " ranks)"));
    }
    if (!buffers.index.emplace(BufferTable::Key(b.holder), static_cast<int32_t>(buffers.bytes.size())).second) {
      return absl::InvalidArgumentError(absl::StrCat(BufferLabel(input, b.holder), " is registered twice"));
    }
    buffers.bytes.push_back(b.bytes);
  }
  // Every placement and fill of a tensor inside its buffer, its span given to `spans`.
  const auto check_spans = [&](const TensorLayouts& t, SpanSink& spans) {
    SHARDSYNC_RETURN_IF_ERROR(CheckPlacements(input, t, t.source, "source", t.source_dtype, buffers, spans));
    SHARDSYNC_RETURN_IF_ERROR(CheckPlacements(input, t, t.target, "target", t.target_dtype, buffers, spans));
    SHARDSYNC_RETURN_IF_ERROR(CheckQuantized(input, t, buffers, spans));
    if (!t.source.fills.empty()) return Invalid(t, "a source layout cannot hold zero fills");
    for (const Fill& f : t.target.fills) {
      if (f.shape.size() > static_cast<size_t>(kMaxAxes)) return Invalid(t, "a fill has too many axes");
      for (int64_t extent : f.shape) {
        if (extent < 0 || extent > kMaxSegmentAxis) {
          return Invalid(t,
                         absl::StrCat("a fill in ", BufferLabel(input, f.holder), " has shape ", IndexToString(f.shape),
                                      "; each axis takes 0 to ", kMaxSegmentAxis, " elements"));
        }
      }
      SHARDSYNC_RETURN_IF_ERROR(
          CheckFits(input, t, "fill", f.holder, f.base, f.shape, f.strides, t.target_dtype, buffers, spans));
    }
    return absl::OkStatus();
  };
  std::set<std::string> names;
  SpanSink spans(buffers.bytes.size());
  for (const TensorLayouts& t : input.tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (!names.insert(t.name).second) return Invalid(t, "named twice in one batch");
    SHARDSYNC_RETURN_IF_ERROR(ValidateShape(t.name, t.shape));
    if (!CanMove(t)) {
      return Invalid(
          t, absl::StrCat("dtype mismatch: source ", DTypeName(t.source_dtype), ", target ", DTypeName(t.target_dtype),
                          " (only equal dtypes, float32 -> bfloat16, or bfloat16 or float32 into "
                          "float8_e4m3 with block scales)"));
    }
    SHARDSYNC_RETURN_IF_ERROR(check_spans(t, spans));
  }
  if (!spans.any_unordered()) return absl::OkStatus();
  spans.StartCollecting();
  for (const TensorLayouts& t : input.tensors) {
    SHARDSYNC_RETURN_IF_ERROR(check_spans(t, spans));  // passed once: cannot fail
  }
  return spans.CheckKept();
}

}  // namespace shardsync::planner

#include "planner/quantize.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "planner/box.h"

namespace shardsync::planner {
namespace {

// Each placement's scratch starts on a 256-byte boundary, as the engines' shards do.
constexpr int64_t kScratchAlignElements = 128;

int64_t AlignUp(int64_t elements) {
  return (elements + kScratchAlignElements - 1) / kScratchAlignElements * kScratchAlignElements;
}

}  // namespace

absl::StatusOr<ScratchLayout> PlaceScratch(const PlanInput& input, int64_t scratch_bytes) {
  if (scratch_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the scratch budget must be positive, not ", scratch_bytes));
  }
  const int64_t budget = scratch_bytes / ElementBytes(DType::kBFloat16);  // elements
  ScratchLayout out;
  out.input = input;
  out.first_stage.assign(input.tensors.size(), 0);
  out.quantized.assign(input.tensors.size(), false);
  // One id on every rank, past every buffer's: ids may name one buffer name on all ranks.
  int32_t scratch_id = 0;
  for (const Buffer& b : input.buffers) scratch_id = std::max(scratch_id, b.holder.buffer + 1);
  std::map<int32_t, int64_t> used;  // elements of the open group, per rank
  std::map<int32_t, int64_t> most;  // elements of the largest group, per rank
  int group = 0;
  for (size_t ti = 0; ti < out.input.tensors.size(); ++ti) {
    TensorLayouts& t = out.input.tensors[ti];
    if (t.target_scales.empty()) continue;
    std::map<int32_t, int64_t> need;
    for (const Placement& p : t.target.placements) need[p.holder.rank] += AlignUp(NumElements(Extent(p.box)));
    bool fits = true;
    for (const auto& [rank, elements] : need) {
      if (elements > budget) {
        return absl::ResourceExhaustedError(absl::StrCat("tensor '", t.name, "': its quantized targets on rank ", rank,
                                                         " need ", elements * ElementBytes(DType::kBFloat16),
                                                         " bytes of bfloat16 scratch; the budget is ", scratch_bytes,
                                                         " bytes per rank"));
      }
      fits = fits && used[rank] + elements <= budget;
    }
    if (!fits) {
      if (++group >= kMaxQuantizeGroups) {
        return absl::ResourceExhaustedError(absl::StrCat("tensor '", t.name, "': the quantized targets need more than ",
                                                         kMaxQuantizeGroups, " groups of ", scratch_bytes,
                                                         " bytes of scratch per rank; give a larger budget"));
      }
      used.clear();
    }
    const int8_t stage = static_cast<int8_t>(2 * group);
    out.first_stage[ti] = stage;
    out.quantized[ti] = true;
    for (size_t pi = 0; pi < t.target.placements.size(); ++pi) {
      Placement& p = t.target.placements[pi];
      const BlockScales& scales = t.target_scales[pi];
      const int32_t rank = p.holder.rank;
      const Index extent = Extent(p.box);
      const Holder scratch{rank, scratch_id};
      const int64_t base = used[rank];
      used[rank] += AlignUp(NumElements(extent));
      most[rank] = std::max(most[rank], used[rank]);
      if (NumElements(extent) > 0) {
        // One row's stride is never stepped: any value the placement gave is no row apart.
        const int64_t row_stride = extent[0] == 1 ? std::max(p.strides[0], extent[1]) : p.strides[0];
        out.quantizes.push_back(QuantizeOp{static_cast<int32_t>(ti), stage, scratch, base, p.holder, p.base, row_stride,
                                           scales.holder, scales.base, scales.row_stride, extent[0], extent[1]});
      }
      p = Placement{p.box, scratch, base, ContiguousStrides(extent)};
    }
    t.target_dtype = DType::kBFloat16;
    t.target_scales.clear();
  }
  for (const auto& [rank, elements] : most) {
    const Buffer buffer{Holder{rank, scratch_id}, elements * ElementBytes(DType::kBFloat16), kScratchBufferName};
    out.scratch.push_back(buffer);
    out.input.buffers.push_back(buffer);
  }
  return out;
}

}  // namespace shardsync::planner

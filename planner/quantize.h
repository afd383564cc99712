// Block-quantized targets: FLOAT8_E4M3 weights with a float32 scale per 128 x 128
// block of each target placement (the layout of vLLM's block-quantized linear layers).
// A scale needs its whole block, and source partitions cut blocks anywhere, so the
// bytes travel as bfloat16 into a scratch region on the receiving rank, and that rank
// quantizes each placement once all of it has arrived.
//
// Scratch is bounded by a per-rank budget: quantized tensors are planned in groups
// that each fit it on every rank, group g in stage 2g (stage 2g+1 is the relay of that
// group, which quantized tensors never take). A rank quantizes a group at the end of
// its stage and reuses the scratch for the next group.
//
// The quantizer, on every block: amax = the largest |x|; scale = amax / 448 (float32,
// rounded to nearest even), or 1 when the block is all zeros; each element becomes
// x / scale (float32) rounded to nearest even and saturated to +-448. Inputs are
// finite: a block holding NaN or infinity gets unspecified values.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/types.h"

namespace shardsync::planner {

inline constexpr int64_t kScaleBlock = 128;    // rows and columns of a block
inline constexpr float kFloat8E4M3Max = 448;   // the largest finite FLOAT8_E4M3
inline constexpr int kMaxQuantizeGroups = 64;  // stages 0..127 (Segment::stage is 8 bits)
// The name a rank's scratch buffer has in a plan's messages; clients cannot register
// names starting "shardsync.".
inline constexpr char kScratchBufferName[] = "shardsync.scratch";
// The per-rank scratch budget when none is given: 1 GiB of bfloat16 (Qwen3-8B's linear
// layers in 14 groups on one rank).
inline constexpr int64_t kDefaultScratchBytes = int64_t{1} << 30;

// Blocks along an axis of `extent` elements (the last block may be partial).
inline int64_t ScaleBlocks(int64_t extent) { return (extent + kScaleBlock - 1) / kScaleBlock; }

// Quantizes one target placement: `rows` x `cols` bfloat16 elements, row-major at
// scratch_base of `scratch`, into the FLOAT8_E4M3 placement at target_base (row
// stride target_row_stride, columns contiguous) and its float32 scales. All three on
// one rank; bases and strides in elements of each buffer's dtype.
struct QuantizeOp {
  int32_t tensor = 0;  // index into PlanInput::tensors
  int8_t stage = 0;    // runs at the end of this stage, after its bytes arrived
  Holder scratch;
  int64_t scratch_base = 0;
  Holder target;
  int64_t target_base = 0;
  int64_t target_row_stride = 0;
  Holder scale;
  int64_t scale_base = 0;
  int64_t scale_row_stride = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

// The input rewritten for planning: every quantized target placement replaced by a
// bfloat16 placement in its rank's scratch buffer (a new buffer on each rank that
// quantizes, of the largest group's bytes there, named kScratchBufferName, with one id
// on every rank: one past the largest id of any input buffer).
struct ScratchLayout {
  PlanInput input;
  std::vector<int8_t> first_stage;  // per tensor: 2g for group g, 0 for the rest
  std::vector<bool> quantized;      // per tensor
  std::vector<Buffer> scratch;      // one per rank that quantizes
  std::vector<QuantizeOp> quantizes;
};

// Groups the quantized tensors in input order, each group within `scratch_bytes` on
// every rank. Refuses a placement larger than the budget and more than
// kMaxQuantizeGroups groups, naming the tensor. `input` is validated.
absl::StatusOr<ScratchLayout> PlaceScratch(const PlanInput& input, int64_t scratch_bytes);

}  // namespace shardsync::planner

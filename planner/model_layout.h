// A whole model in a few lines: its tensors, how the trainer stores them (ZeRO stage
// over DP ranks) and how the rollout holds them (TP replicas, fused and padded views).
// ExpandModel turns it into placements with the builders.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/types.h"

namespace shardsync::planner {

// How a TP rank of the rollout holds a tensor (vLLM's linear layer kinds).
enum class TpStyle {
  kReplicated,  // whole on every TP rank (norms, row-parallel bias)
  kColumn,      // rows split (axis 0)
  kRow,         // columns split (axis 1)
  kVocab,       // rows split after padding to a multiple of 64; pad rows zero-filled
};

struct ModelTensor {
  std::string name;
  Index shape;
  DType dtype = DType::kBFloat16;
  TpStyle style = TpStyle::kReplicated;
  // Split in units of this many indices (a head), AutoTP-style: TP rank r gets
  // units/tp + (r < units % tp) units.
  int64_t split_unit = 1;
  // Tied weights: this target tensor has no source of its own and reads `tied_to`.
  std::string tied_to;
};

ModelTensor MakeTensor(std::string name, Index shape, DType dtype = DType::kBFloat16,
                       TpStyle style = TpStyle::kReplicated, int64_t split_unit = 1);

// q, k and v land in one fused shard per TP rank (vLLM QKVParallelLinear).
struct FusedQkvGroup {
  std::string q, k, v;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

// Column-parallel weights fused along rows (MergedColumnParallelLinear: gate_up).
struct FusedRowsGroup {
  std::vector<std::string> parts;
};

struct ModelLayoutSpec {
  std::vector<ModelTensor> tensors;
  std::vector<FusedQkvGroup> fused_qkv;
  std::vector<FusedRowsGroup> fused_rows;
  int zero_stage = 3;                          // 1, 2 or 3
  std::vector<int32_t> dp_ranks;               // trainer: global rank of each DP index
  std::vector<std::vector<int32_t>> replicas;  // rollout: each replica's ranks by TP rank
  // The rollout's dtype when it differs from the trainer's (a float32 master into a
  // bfloat16 copy); unset: the same dtype. FLOAT8_E4M3: every 2-D COLUMN or ROW tensor
  // in float8, its float32 scales per 128 x 128 block in a grid of its own after it in
  // the arena (planner/quantize.h; a fused layer's parts each have their own grid); the
  // rest keep their dtype.
  std::optional<DType> target_dtype;
  // Buffer ids: the trainer's flat on each DP rank, the rollout's arena on each TP rank.
  int32_t source_buffer = 0;
  int32_t target_buffer = 1;
};

absl::StatusOr<PlanInput> ExpandModel(const ModelLayoutSpec& spec);

}  // namespace shardsync::planner

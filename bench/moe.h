// A Kimi-K2-sized MoE for the planner benchmark: 61 layers of 384 experts (hidden 7168,
// expert intermediate 2048) plus MLA attention and a shared expert, about 70k tensors.
// Trainer: experts ZeRO-3 inside expert-parallel groups (EP x DP), dense tensors ZeRO-3
// over all ranks. Rollout: replicas of EP x TP, dense tensors TP-split in every TP group.
#pragma once

#include "planner/types.h"

namespace shardsync::bench {

struct MoeShape {
  int64_t layers = 61;
  int64_t experts = 384;
  int64_t hidden = 7168;
  int64_t expert_intermediate = 2048;
  int train_ep = 64;
  int train_dp = 16;
  int replicas = 8;
  int infer_ep = 32;
  int infer_tp = 4;
  bool dense = true;  // include attention, shared expert, router, embeddings
  // The rollout's ranks start here (trainer ranks 0..train_ep*train_dp-1): past them,
  // the two sides are on different GPUs.
  int rollout_first_rank = 0;
  int gpus_per_node = 0;  // > 0: rank r on node r / gpus_per_node (PlanInput::node_of_rank)
};

planner::PlanInput MoeLayout(const MoeShape& shape);

}  // namespace shardsync::bench

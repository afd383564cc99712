// Mixture-of-experts models as a trainer and a rollout hold them, for planning
// without a cluster (shardsyncctl plan, the benchmarks): experts ZeRO-3 inside
// expert-parallel groups (EP x DP) on the trainer, dense tensors ZeRO-3 over all its
// ranks; on the rollout, replicas of EP x TP with the dense tensors TP-split in every
// TP group. The presets take a published model's expert shape (layers, experts,
// hidden, expert width); the attention, embeddings and shared expert are Kimi-K2's
// (MLA) for all of them.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/types.h"

namespace shardsync::planner {

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

// Refuses a shape whose experts do not divide over either side's EP, or a count that
// is not positive, naming the field.
absl::Status CheckMoeShape(const MoeShape& shape);
PlanInput MoeLayout(const MoeShape& shape);

// The expert shapes of the presets ("kimi-k2-sized", "qwen3-235b-sized",
// "glm-4.5-sized"): layers, experts, hidden and expert width set, the rest as given.
absl::StatusOr<MoeShape> MoePreset(const std::string& name, MoeShape shape);
std::vector<std::string> MoePresetNames();

}  // namespace shardsync::planner

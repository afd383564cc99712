// Parameter shapes of known models, named as their Hugging Face checkpoints name them
// (no download: the shapes follow from each config).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model_layout.h"

namespace shardsync::planner {

struct DenseModelConfig {
  std::string name;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;
};

// "qwen3-0.6b", "qwen3-1.7b", "qwen3-8b".
absl::StatusOr<DenseModelConfig> FindDenseModel(const std::string& name);

// The model's tensors as the rollout holds them: column/row parallel, padded vocab,
// tied head; with `fused`, q/k/v and gate/up land in fused shards (vLLM's view).
// Fill in dp_ranks, zero_stage and replicas to plan it.
ModelLayoutSpec Qwen3Layout(const DenseModelConfig& config, bool fused);

}  // namespace shardsync::planner

#include "planner/known_models.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardsync::planner {
namespace {

const std::vector<DenseModelConfig>& Known() {
  static const std::vector<DenseModelConfig> models = {
      // name, hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied
      {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, true},
      {"qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, true},
      {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, false},
  };
  return models;
}

ModelTensor Tensor(std::string name, Index shape, TpStyle style, int64_t split_unit = 1) {
  return MakeTensor(std::move(name), std::move(shape), DType::kBFloat16, style, split_unit);
}

}  // namespace

absl::StatusOr<DenseModelConfig> FindDenseModel(const std::string& name) {
  for (const DenseModelConfig& m : Known()) {
    if (m.name == name) return m;
  }
  std::vector<std::string> names;
  for (const DenseModelConfig& m : Known()) names.push_back(m.name);
  return absl::NotFoundError(absl::StrCat("unknown model '", name, "' (known: ", absl::StrJoin(names, ", "), ")"));
}

ModelLayoutSpec Qwen3Layout(const DenseModelConfig& c, bool fused) {
  ModelLayoutSpec spec;
  auto& t = spec.tensors;
  t.push_back(Tensor("model.embed_tokens.weight", {c.vocab, c.hidden}, TpStyle::kVocab));
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string attn = p + "self_attn.";
    const std::string mlp = p + "mlp.";
    t.push_back(Tensor(p + "input_layernorm.weight", {c.hidden}, TpStyle::kReplicated));
    t.push_back(Tensor(attn + "q_proj.weight", {c.heads * c.head_dim, c.hidden}, TpStyle::kColumn, c.head_dim));
    t.push_back(Tensor(attn + "k_proj.weight", {c.kv_heads * c.head_dim, c.hidden}, TpStyle::kColumn, c.head_dim));
    t.push_back(Tensor(attn + "v_proj.weight", {c.kv_heads * c.head_dim, c.hidden}, TpStyle::kColumn, c.head_dim));
    t.push_back(Tensor(attn + "o_proj.weight", {c.hidden, c.heads * c.head_dim}, TpStyle::kRow, c.head_dim));
    t.push_back(Tensor(attn + "q_norm.weight", {c.head_dim}, TpStyle::kReplicated));
    t.push_back(Tensor(attn + "k_norm.weight", {c.head_dim}, TpStyle::kReplicated));
    t.push_back(Tensor(p + "post_attention_layernorm.weight", {c.hidden}, TpStyle::kReplicated));
    t.push_back(Tensor(mlp + "gate_proj.weight", {c.intermediate, c.hidden}, TpStyle::kColumn));
    t.push_back(Tensor(mlp + "up_proj.weight", {c.intermediate, c.hidden}, TpStyle::kColumn));
    t.push_back(Tensor(mlp + "down_proj.weight", {c.hidden, c.intermediate}, TpStyle::kRow));
    if (fused) {
      spec.fused_qkv.push_back(FusedQkvGroup{attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight",
                                             c.heads, c.kv_heads, c.head_dim});
      spec.fused_rows.push_back(FusedRowsGroup{{mlp + "gate_proj.weight", mlp + "up_proj.weight"}});
    }
  }
  t.push_back(Tensor("model.norm.weight", {c.hidden}, TpStyle::kReplicated));
  ModelTensor head = Tensor("lm_head.weight", {c.vocab, c.hidden}, TpStyle::kVocab);
  if (c.tied_embeddings) head.tied_to = "model.embed_tokens.weight";
  t.push_back(head);
  return spec;
}

}  // namespace shardsync::planner

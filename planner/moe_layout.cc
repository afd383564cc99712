#include "planner/moe_layout.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/arena.h"
#include "planner/builders.h"

namespace shardsync::planner {
namespace {

enum Split { kColumn = 0, kRow = 1, kWhole = -1 };

struct Dense {
  std::string name;
  Index shape;
  Split split;
};

std::vector<Dense> DenseTensors(const MoeShape& m) {
  const int64_t h = m.hidden;
  std::vector<Dense> out = {{"model.embed_tokens.weight", {163840, h}, kColumn}};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    for (Dense d : std::vector<Dense>{
             {"input_layernorm.weight", {h}, kWhole},
             {"self_attn.q_a_proj.weight", {1536, h}, kWhole},
             {"self_attn.q_a_layernorm.weight", {1536}, kWhole},
             {"self_attn.q_b_proj.weight", {64 * 192, 1536}, kColumn},
             {"self_attn.kv_a_proj_with_mqa.weight", {576, h}, kWhole},
             {"self_attn.kv_a_layernorm.weight", {512}, kWhole},
             {"self_attn.kv_b_proj.weight", {64 * 256, 512}, kColumn},
             {"self_attn.o_proj.weight", {h, 64 * 128}, kRow},
             {"post_attention_layernorm.weight", {h}, kWhole},
             {"mlp.gate.weight", {m.experts, h}, kWhole},
             {"mlp.shared_experts.gate_proj.weight", {m.expert_intermediate, h}, kColumn},
             {"mlp.shared_experts.up_proj.weight", {m.expert_intermediate, h}, kColumn},
             {"mlp.shared_experts.down_proj.weight", {h, m.expert_intermediate}, kRow},
         }) {
      d.name = p + d.name;
      out.push_back(std::move(d));
    }
  }
  out.push_back({"model.norm.weight", {h}, kWhole});
  out.push_back({"lm_head.weight", {163840, h}, kColumn});
  return out;
}

// Target layout of one tensor over one TP group, packed into each rank's arena.
Layout TpTarget(const Index& shape, Split split, const std::vector<int32_t>& ranks, ArenaPacker& arena) {
  const DType dtype = DType::kBFloat16;
  std::vector<int64_t> offsets;
  if (split == kWhole) {
    for (int32_t r : ranks) offsets.push_back(arena.Reserve(r, NumElements(shape), dtype));
    return Replicated(shape, ranks, arena.buffer_id(), offsets);
  }
  const std::vector<int64_t> sizes = UnevenSplit(shape[split], static_cast<int>(ranks.size()));
  for (size_t i = 0; i < ranks.size(); ++i) {
    offsets.push_back(arena.Reserve(ranks[i], ElementsPerIndex(shape, split) * sizes[i], dtype));
  }
  return *TpSplit(shape, split, sizes, ranks, arena.buffer_id(), offsets);
}

}  // namespace

PlanInput MoeLayout(const MoeShape& m) {
  const DType dtype = DType::kBFloat16;
  const int world = m.train_ep * m.train_dp;
  const int32_t kExpertFlat = 0, kDenseFlat = 1, kArena = 2;
  PlanInput input;
  ArenaPacker expert_flat(kExpertFlat), dense_flat(kDenseFlat), arena(kArena);

  // Rollout TP groups: replica k, EP rank j -> ranks k*group + j*tp + t.
  const int per_replica = m.infer_ep * m.infer_tp;
  auto tp_group = [&](int replica, int ep) {
    std::vector<int32_t> ranks;
    for (int t = 0; t < m.infer_tp; ++t) {
      ranks.push_back(m.rollout_first_rank + replica * per_replica + ep * m.infer_tp + t);
    }
    return ranks;
  };

  if (m.dense) {
    std::vector<int32_t> all(world);
    for (int r = 0; r < world; ++r) all[r] = r;
    for (const Dense& d : DenseTensors(m)) {
      const int64_t part = Zero3PartitionSize(NumElements(d.shape), world);
      TensorLayouts t{
          d.name, d.shape, dtype, dtype, Zero3(d.shape, all, kDenseFlat, dense_flat.ReserveCommon(all, part, dtype)),
          {}};
      std::vector<Layout> targets;
      for (int k = 0; k < m.replicas; ++k) {
        for (int j = 0; j < m.infer_ep; ++j) targets.push_back(TpTarget(d.shape, d.split, tp_group(k, j), arena));
      }
      t.target = Concat(std::move(targets));
      input.tensors.push_back(std::move(t));
    }
  }

  // Experts: EP rank e / (experts / ep) holds expert e; ZeRO-3 over that EP rank's DP group.
  const int64_t train_per_ep = m.experts / m.train_ep;
  const int64_t infer_per_ep = m.experts / m.infer_ep;
  for (int64_t l = 0; l < m.layers; ++l) {
    for (int64_t e = 0; e < m.experts; ++e) {
      std::vector<int32_t> dp;
      const int ep = static_cast<int>(e / train_per_ep);
      for (int d = 0; d < m.train_dp; ++d) dp.push_back(d * m.train_ep + ep);
      const std::string p = absl::StrCat("model.layers.", l, ".mlp.experts.", e, ".");
      const std::vector<Dense> weights = {{"gate_proj.weight", {m.expert_intermediate, m.hidden}, kColumn},
                                          {"up_proj.weight", {m.expert_intermediate, m.hidden}, kColumn},
                                          {"down_proj.weight", {m.hidden, m.expert_intermediate}, kRow}};
      for (const Dense& w : weights) {
        const int64_t part = Zero3PartitionSize(NumElements(w.shape), m.train_dp);
        TensorLayouts t{p + w.name,
                        w.shape,
                        dtype,
                        dtype,
                        Zero3(w.shape, dp, kExpertFlat, expert_flat.ReserveCommon(dp, part, dtype)),
                        {}};
        std::vector<Layout> targets;
        for (int k = 0; k < m.replicas; ++k) {
          targets.push_back(TpTarget(w.shape, w.split, tp_group(k, static_cast<int>(e / infer_per_ep)), arena));
        }
        t.target = Concat(std::move(targets));
        input.tensors.push_back(std::move(t));
      }
    }
  }
  for (const auto* packer : {&expert_flat, &dense_flat, &arena}) {
    for (const Buffer& b : packer->Buffers()) input.buffers.push_back(b);
  }
  if (m.gpus_per_node > 0) {
    const int32_t ranks = NumRanks(input);
    for (int32_t r = 0; r < ranks; ++r) input.node_of_rank.push_back(r / m.gpus_per_node);
  }
  return input;
}

namespace {

struct ExpertShape {
  const char* name;
  int64_t layers, experts, hidden, expert_intermediate;
};

// Published configs: Kimi-K2 (61 layers, 384 experts, hidden 7168, moe_intermediate_size
// 2048; its first layer is dense, counted here as MoE), Qwen3-235B-A22B (94, 128, 4096,
// 1536), GLM-4.5 (92, 160, 5120, 1536).
constexpr ExpertShape kPresets[] = {
    {"kimi-k2-sized", 61, 384, 7168, 2048},
    {"qwen3-235b-sized", 94, 128, 4096, 1536},
    {"glm-4.5-sized", 92, 160, 5120, 1536},
};

}  // namespace

absl::Status CheckMoeShape(const MoeShape& m) {
  for (const auto& [name, value] : std::vector<std::pair<const char*, int64_t>>{{"layers", m.layers},
                                                                                {"experts", m.experts},
                                                                                {"hidden", m.hidden},
                                                                                {"expert width", m.expert_intermediate},
                                                                                {"trainer EP", m.train_ep},
                                                                                {"trainer DP", m.train_dp},
                                                                                {"replicas", m.replicas},
                                                                                {"rollout EP", m.infer_ep},
                                                                                {"rollout TP", m.infer_tp}}) {
    if (value <= 0)
      return absl::InvalidArgumentError(absl::StrCat("the MoE's ", name, " is ", value, ", not positive"));
  }
  for (const auto& [side, ep] : {std::make_pair("trainer", m.train_ep), std::make_pair("rollout", m.infer_ep)}) {
    if (m.experts % ep != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(m.experts, " experts do not divide over the ", side, "'s EP of ", ep));
    }
  }
  if (m.rollout_first_rank < 0 || m.gpus_per_node < 0) {
    return absl::InvalidArgumentError("the rollout's first rank and the GPUs per node cannot be negative");
  }
  return absl::OkStatus();
}

absl::StatusOr<MoeShape> MoePreset(const std::string& name, MoeShape shape) {
  for (const ExpertShape& p : kPresets) {
    if (name != p.name) continue;
    shape.layers = p.layers;
    shape.experts = p.experts;
    shape.hidden = p.hidden;
    shape.expert_intermediate = p.expert_intermediate;
    return shape;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown MoE preset '", name, "' (", absl::StrJoin(MoePresetNames(), ", "), ")"));
}

std::vector<std::string> MoePresetNames() {
  std::vector<std::string> names;
  for (const ExpertShape& p : kPresets) names.push_back(p.name);
  return names;
}

}  // namespace shardsync::planner

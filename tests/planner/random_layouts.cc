#include "tests/planner/random_layouts.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "planner/arena.h"
#include "planner/box.h"
#include "planner/builders.h"

namespace shardsync::testing {
namespace {

using planner::Index;
using planner::ModelTensor;
using planner::TpStyle;

int Uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

template <typename T>
const T& Pick(std::mt19937_64& rng, const std::vector<T>& options) {
  return options[Uniform(rng, 0, static_cast<int>(options.size()) - 1)];
}

std::vector<int32_t> RandomRanks(std::mt19937_64& rng, int world, int count) {
  std::vector<int32_t> ranks(world);
  std::iota(ranks.begin(), ranks.end(), 0);
  std::shuffle(ranks.begin(), ranks.end(), rng);
  ranks.resize(count);
  return ranks;
}

Index RandomShape(std::mt19937_64& rng, int axes) {
  static const std::vector<int64_t> dims = {1, 2, 3, 4, 5, 7, 8, 12, 13, 16};
  Index shape;
  for (int k = 0; k < axes; ++k) shape.push_back(Pick(rng, dims));
  return shape;
}

ModelTensor Tensor(std::string name, Index shape, planner::DType dtype, TpStyle style = TpStyle::kReplicated) {
  return planner::MakeTensor(std::move(name), std::move(shape), dtype, style);
}

}  // namespace

planner::ModelLayoutSpec RandomModel(std::mt19937_64& rng) {
  planner::ModelLayoutSpec spec;
  const int world = Uniform(rng, 1, 8);
  spec.zero_stage = Uniform(rng, 1, 3);
  spec.dp_ranks = RandomRanks(rng, world, Uniform(rng, 1, world));
  const int replicas = Uniform(rng, 1, 3);
  int tp_lcm = 1;
  bool vocab_ok = true;  // padded vocab rows (a multiple of 64) must split over every tp
  for (int r = 0; r < replicas; ++r) {
    const int tp = Uniform(rng, 1, world);
    spec.replicas.push_back(RandomRanks(rng, world, tp));
    tp_lcm = std::lcm(tp_lcm, tp);
    vocab_ok = vocab_ok && 64 % tp == 0;
  }
  const int dtype_case = Uniform(rng, 0, 3);
  const planner::DType dtype =
      std::vector<planner::DType>{planner::DType::kBFloat16, planner::DType::kFloat32, planner::DType::kUInt8,
                                  planner::DType::kFloat32}[dtype_case];
  if (dtype_case == 3) spec.target_dtype = planner::DType::kBFloat16;

  const int count = Uniform(rng, 1, 6);
  for (int i = 0; i < count; ++i) {
    const std::string name = absl::StrCat("t", i);
    const int kind = Uniform(rng, 0, 9);
    if (kind == 0 && tp_lcm <= 8) {  // fused qkv
      const int64_t kv = Pick(rng, std::vector<int64_t>{1, 2, 4});
      const int64_t heads = kv * Pick(rng, std::vector<int64_t>{1, 2});
      const int64_t head_dim = Uniform(rng, 1, 3);
      bool ok = true;
      for (const auto& ranks : spec.replicas) {
        const int64_t tp = static_cast<int64_t>(ranks.size());
        ok = ok && heads % tp == 0 && (tp >= kv ? tp % kv == 0 : kv % tp == 0);
      }
      if (!ok) continue;
      const Index trailing = RandomShape(rng, Uniform(rng, 0, 1));
      auto shape = [&](int64_t rows) {
        Index s{rows};
        s.insert(s.end(), trailing.begin(), trailing.end());
        return s;
      };
      spec.tensors.push_back(Tensor(name + ".q", shape(heads * head_dim), dtype, TpStyle::kColumn));
      spec.tensors.push_back(Tensor(name + ".k", shape(kv * head_dim), dtype, TpStyle::kColumn));
      spec.tensors.push_back(Tensor(name + ".v", shape(kv * head_dim), dtype, TpStyle::kColumn));
      spec.fused_qkv.push_back(planner::FusedQkvGroup{name + ".q", name + ".k", name + ".v", heads, kv, head_dim});
    } else if (kind == 1 && tp_lcm <= 8) {  // fused gate_up
      const Index trailing = RandomShape(rng, 1);
      planner::FusedRowsGroup group;
      for (const char* part : {".gate", ".up"}) {
        Index shape{tp_lcm * Uniform(rng, 1, 3)};
        shape.insert(shape.end(), trailing.begin(), trailing.end());
        spec.tensors.push_back(Tensor(name + part, shape, dtype, TpStyle::kColumn));
        group.parts.push_back(name + part);
      }
      spec.fused_rows.push_back(group);
    } else if (kind == 2 && vocab_ok) {  // padded vocabulary, maybe with a tied head
      spec.tensors.push_back(
          Tensor(name + ".embed", Index{Uniform(rng, 1, 150), Uniform(rng, 1, 3)}, dtype, TpStyle::kVocab));
      if (Uniform(rng, 0, 1)) {
        ModelTensor head = spec.tensors.back();
        head.name = name + ".lm_head";
        head.tied_to = name + ".embed";
        spec.tensors.push_back(head);
      }
    } else {
      const int axes = Uniform(rng, 1, 3);
      ModelTensor t = Tensor(name, RandomShape(rng, axes), dtype);
      t.style = Pick(rng, std::vector<TpStyle>{TpStyle::kReplicated, TpStyle::kColumn, TpStyle::kRow});
      if (t.style == TpStyle::kRow && axes < 2) t.style = TpStyle::kColumn;
      const int axis = t.style == TpStyle::kRow ? 1 : 0;
      if (t.style != TpStyle::kReplicated && t.shape[axis] % 2 == 0 && Uniform(rng, 0, 1)) t.split_unit = 2;
      spec.tensors.push_back(t);
    }
  }
  if (spec.tensors.empty()) spec.tensors.push_back(Tensor("scalar_like", Index{1}, dtype));
  return spec;
}

planner::PlanInput RandomMixedSources(std::mt19937_64& rng) {
  using planner::Layout;
  const int world = Uniform(rng, 1, 8);
  const Index shape = RandomShape(rng, Uniform(rng, 1, 3));
  const planner::DType dtype = planner::DType::kBFloat16;
  const int64_t numel = planner::NumElements(shape);
  planner::PlanInput input;
  planner::ArenaPacker sources(0), targets(1);
  std::vector<Layout> source_parts;

  // ZeRO-3 over some ranks (partitions at offset 0 of a fresh flat).
  const std::vector<int32_t> dp = RandomRanks(rng, world, Uniform(rng, 1, world));
  const int64_t part = planner::Zero3PartitionSize(numel, static_cast<int>(dp.size()));
  source_parts.push_back(planner::Zero3(shape, dp, 0, sources.ReserveCommon(dp, part, dtype)));

  const int axis = Uniform(rng, 0, static_cast<int>(shape.size()) - 1);
  if (Uniform(rng, 0, 1)) {  // a surviving TP shard layout, uneven
    const std::vector<int32_t> ranks = RandomRanks(rng, world, Uniform(rng, 1, world));
    const std::vector<int64_t> sizes = planner::UnevenSplit(shape[axis], static_cast<int>(ranks.size()));
    std::vector<int64_t> offsets;
    for (size_t i = 0; i < ranks.size(); ++i)
      offsets.push_back(sources.Reserve(ranks[i], planner::ElementsPerIndex(shape, axis) * sizes[i], dtype));
    source_parts.push_back(*planner::TpSplit(shape, axis, sizes, ranks, 0, offsets));
  }
  if (Uniform(rng, 0, 1)) {  // TP shards that are themselves ZeRO-3 partitioned
    const int tp = Uniform(rng, 1, std::min<int>(world, static_cast<int>(shape[axis])));
    const std::vector<int64_t> sizes = planner::UnevenSplit(shape[axis], tp);
    // Virtual holders 0..tp-1 name the inner layouts.
    std::vector<int32_t> shard_ids(tp);
    std::iota(shard_ids.begin(), shard_ids.end(), 0);
    const Layout outer = *planner::TpSplit(shape, axis, sizes, shard_ids, 0, std::vector<int64_t>(tp, 0));
    std::vector<Layout> inner;
    for (const planner::Placement& p : outer.placements) {
      const Index extent = planner::Extent(p.box);
      const std::vector<int32_t> ranks = RandomRanks(rng, world, Uniform(rng, 1, world));
      const int64_t shard_part =
          planner::Zero3PartitionSize(planner::NumElements(extent), static_cast<int>(ranks.size()));
      inner.push_back(planner::Zero3(extent, ranks, 0, sources.ReserveCommon(ranks, shard_part, dtype)));
    }
    source_parts.push_back(*planner::Nest(outer, inner));
  }

  // Targets: one or two TP replicas, each placed through Nest (replica -> TP layout).
  const int replicas = Uniform(rng, 1, 2);
  Layout outer;
  std::vector<Layout> inner;
  for (int k = 0; k < replicas; ++k) {
    outer.placements.push_back(
        planner::Placement{planner::FullBox(shape), planner::Holder{k, 0}, 0, planner::ContiguousStrides(shape)});
    const int target_axis = Uniform(rng, 0, static_cast<int>(shape.size()) - 1);
    const std::vector<int32_t> ranks = RandomRanks(rng, world, Uniform(rng, 1, world));
    const std::vector<int64_t> sizes = planner::UnevenSplit(shape[target_axis], static_cast<int>(ranks.size()));
    std::vector<int64_t> offsets;
    for (size_t i = 0; i < ranks.size(); ++i) {
      offsets.push_back(targets.Reserve(ranks[i], planner::ElementsPerIndex(shape, target_axis) * sizes[i], dtype));
    }
    inner.push_back(*planner::TpSplit(shape, target_axis, sizes, ranks, 1, offsets));
  }
  planner::TensorLayouts t{"mixed", shape, dtype, dtype, planner::Concat(source_parts), *planner::Nest(outer, inner)};
  input.tensors.push_back(std::move(t));
  input.buffers = sources.Buffers();
  for (const planner::Buffer& b : targets.Buffers()) input.buffers.push_back(b);
  return input;
}

void PlaceOnRandomNodes(planner::PlanInput& input, int nodes, std::mt19937_64& rng) {
  int32_t ranks = 0;
  for (const planner::Buffer& b : input.buffers) ranks = std::max(ranks, b.holder.rank + 1);
  input.node_of_rank.clear();
  for (int32_t r = 0; r < ranks; ++r) input.node_of_rank.push_back(Uniform(rng, 0, nodes - 1));
}

}  // namespace shardsync::testing

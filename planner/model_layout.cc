#include "planner/model_layout.h"

#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/arena.h"
#include "planner/box.h"
#include "planner/builders.h"
#include "planner/quantize.h"

namespace shardsync::planner {
namespace {

Index Trailing(const Index& shape) { return Index(shape.begin() + 1, shape.end()); }

absl::Status Bad(const std::string& tensor, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("model tensor '", tensor, "': ", what));
}

// Target layouts of one replica, tensor by tensor, packed into each rank's arena.
class ReplicaBuilder {
 public:
  ReplicaBuilder(const std::vector<int32_t>& ranks, ArenaPacker& arena) : ranks_(ranks), arena_(arena) {}

  absl::StatusOr<Layout> Plain(const ModelTensor& t) {
    const int tp = static_cast<int>(ranks_.size());
    if (t.style == TpStyle::kReplicated) {
      return Replicated(t.shape, ranks_, arena_.buffer_id(), Reserve(NumElements(t.shape), t.dtype));
    }
    if (t.style == TpStyle::kVocab) {
      if (t.shape.empty()) return Bad(t.name, "a vocabulary needs at least one axis");
      const int64_t rows = PaddedVocabShardRows(t.shape[0], tp);
      return PaddedVocab(t.shape[0], Trailing(t.shape), ranks_, arena_.buffer_id(),
                         Reserve(rows * NumElements(Trailing(t.shape)), t.dtype));
    }
    const int axis = t.style == TpStyle::kColumn ? 0 : 1;
    if (static_cast<int>(t.shape.size()) <= axis) {
      return Bad(t.name, absl::StrCat("cannot split axis ", axis, " of shape ", IndexToString(t.shape)));
    }
    if (t.split_unit <= 0 || t.shape[axis] % t.split_unit != 0) {
      return Bad(t.name, absl::StrCat("axis ", axis, " of ", t.shape[axis], " is not a multiple of its split unit ",
                                      t.split_unit));
    }
    std::vector<int64_t> sizes = UnevenSplit(t.shape[axis] / t.split_unit, tp);
    std::vector<int64_t> offsets;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      sizes[r] *= t.split_unit;
      offsets.push_back(arena_.Reserve(ranks_[r], ElementsPerIndex(t.shape, axis) * sizes[r], t.dtype));
    }
    return TpSplit(t.shape, axis, sizes, ranks_, arena_.buffer_id(), offsets);
  }

  absl::StatusOr<QkvViews> Qkv(const FusedQkvGroup& g, const ModelTensor& q) {
    const int64_t rows = FusedQkvShardRows(g.num_heads, g.num_kv_heads, g.head_dim, static_cast<int>(ranks_.size()));
    return FusedQkv(g.num_heads, g.num_kv_heads, g.head_dim, Trailing(q.shape), ranks_, arena_.buffer_id(),
                    Reserve(rows * NumElements(Trailing(q.shape)), q.dtype));
  }

  absl::StatusOr<std::vector<Layout>> Rows(const std::vector<const ModelTensor*>& parts) {
    std::vector<int64_t> rows;
    int64_t total = 0;
    for (const ModelTensor* p : parts) {
      rows.push_back(p->shape[0]);
      total += p->shape[0];
    }
    const Index trailing = Trailing(parts[0]->shape);
    const int64_t tp = static_cast<int64_t>(ranks_.size());
    return FusedRows(rows, trailing, ranks_, arena_.buffer_id(),
                     Reserve(total / tp * NumElements(trailing), parts[0]->dtype));
  }

 private:
  std::vector<int64_t> Reserve(int64_t elements, DType dtype) {
    std::vector<int64_t> offsets;
    for (int32_t rank : ranks_) offsets.push_back(arena_.Reserve(rank, elements, dtype));
    return offsets;
  }

  const std::vector<int32_t>& ranks_;
  ArenaPacker& arena_;
};

}  // namespace

ModelTensor MakeTensor(std::string name, Index shape, DType dtype, TpStyle style, int64_t split_unit) {
  ModelTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.dtype = dtype;
  t.style = style;
  t.split_unit = split_unit;
  return t;
}

namespace {

// Sizes are checked before any offset is summed from them (found by the fuzzer: a huge
// extent overflowed the arena's offsets). 2^50 bytes is far beyond any model and far
// from int64's end.
absl::Status CheckSizes(const std::vector<ModelTensor>& tensors) {
  constexpr int64_t kMaxModelBytes = int64_t{1} << 50;
  int64_t model_bytes = 0;
  for (const ModelTensor& t : tensors) {
    if (t.shape.size() > static_cast<size_t>(kMaxAxes)) return Bad(t.name, "has more axes than are supported");
    int64_t numel = 1;
    for (int64_t extent : t.shape) {
      if (extent < 0) return Bad(t.name, "has a negative extent");
      if (extent > 0 && numel > kMaxModelBytes / extent) return Bad(t.name, "is larger than 2^50 elements");
      numel *= extent;
    }
    model_bytes += numel * ElementBytes(t.dtype);
    if (model_bytes > kMaxModelBytes) return Bad(t.name, "makes the model larger than 2^50 bytes");
  }
  return absl::OkStatus();
}

// The trainer's side: the `sourced` tensors back to back in one ZeRO flat on every DP
// rank (ZeRO-3 partitions or ZeRO-1/2 replicas), each as a PlanInput tensor (`index`
// gets its position) whose target dtype is `target_dtype`'s, and the flat's buffers.
absl::Status AddSources(const ModelLayoutSpec& spec, const std::vector<const ModelTensor*>& sourced,
                        const std::function<DType(const ModelTensor&)>& target_dtype, PlanInput& input,
                        std::map<std::string, size_t>& index) {
  std::vector<int64_t> numels;
  for (const ModelTensor* t : sourced) {
    if (t->dtype != sourced[0]->dtype) {
      return Bad(t->name, "a ZeRO flat holds one dtype; this tensor's differs from the first tensor's");
    }
    numels.push_back(NumElements(t->shape));
  }
  const int world = static_cast<int>(spec.dp_ranks.size());
  const std::vector<int64_t> offsets =
      spec.zero_stage == 3 ? Zero3Offsets(numels, world) : Zero12Offsets(numels, world);
  for (size_t i = 0; i < sourced.size(); ++i) {
    const ModelTensor& t = *sourced[i];
    index[t.name] = input.tensors.size();
    Layout source = spec.zero_stage == 3 ? Zero3(t.shape, spec.dp_ranks, spec.source_buffer, offsets[i])
                                         : Zero12(t.shape, spec.dp_ranks, spec.source_buffer, offsets[i]);
    input.tensors.push_back(TensorLayouts{t.name, t.shape, t.dtype, target_dtype(t), std::move(source), Layout{}});
  }
  if (!sourced.empty()) {
    for (int32_t rank : spec.dp_ranks) {
      input.buffers.push_back(
          Buffer{Holder{rank, spec.source_buffer}, offsets.back() * ElementBytes(sourced[0]->dtype), {}});
    }
  }
  return absl::OkStatus();
}

// The rollout's side: every replica's placements (and float8 scales) of every target
// tensor, added to the source tensors AddSources made, packed into each rank's arena.
class TargetExpander {
 public:
  TargetExpander(const ModelLayoutSpec& spec, PlanInput& input, const std::map<std::string, size_t>& index)
      : spec_(spec), input_(input), index_(index), arena_(spec.target_buffer) {}

  // Checks every name and fused group of the spec; call once before Replica.
  absl::Status CheckNames() {
    for (const ModelTensor& t : spec_.tensors) {
      if (!by_name_.emplace(t.name, &t).second) return Bad(t.name, "declared twice");
    }
    for (const FusedQkvGroup& g : spec_.fused_qkv) {
      for (const std::string* m : {&g.q, &g.k, &g.v}) {
        if (!by_name_.count(*m)) return Bad(*m, "named by a fused qkv group but not declared");
        qkv_of_[*m] = &g;
      }
    }
    for (const FusedRowsGroup& g : spec_.fused_rows) {
      if (g.parts.empty()) return absl::InvalidArgumentError("a fused rows group has no parts");
      for (const std::string& m : g.parts) {
        if (!by_name_.count(m)) return Bad(m, "named by a fused rows group but not declared");
        rows_of_[m] = &g;
      }
    }
    return absl::OkStatus();
  }

  // Float8 targets are the linear layers: 2-D split tensors only.
  bool Quantized(const ModelTensor& t) const {
    return Float8() && t.shape.size() == 2 && (t.style == TpStyle::kColumn || t.style == TpStyle::kRow);
  }
  DType TargetDtype(const ModelTensor& t) const {
    return Quantized(t) ? DType::kFloat8E4M3 : Float8() ? t.dtype : spec_.target_dtype.value_or(t.dtype);
  }

  absl::Status Replica(const std::vector<int32_t>& ranks) {
    if (ranks.empty()) return absl::InvalidArgumentError("a rollout replica has no ranks");
    ReplicaBuilder replica(ranks, arena_);
    for (const ModelTensor& declared : spec_.tensors) {
      ModelTensor t = declared;  // as the rollout holds it
      t.dtype = TargetDtype(declared);
      if (auto q = qkv_of_.find(t.name); q != qkv_of_.end()) {
        const FusedQkvGroup& g = *q->second;
        if (t.name != g.q) continue;  // the group is placed once, at its q
        auto views = replica.Qkv(g, t);
        if (!views.ok()) return Bad(t.name, std::string(views.status().message()));
        SHARDSYNC_RETURN_IF_ERROR(Add(t, std::move(views->q)));
        SHARDSYNC_RETURN_IF_ERROR(Add(*by_name_.at(g.k), std::move(views->k)));
        SHARDSYNC_RETURN_IF_ERROR(Add(*by_name_.at(g.v), std::move(views->v)));
      } else if (auto r = rows_of_.find(t.name); r != rows_of_.end()) {
        const FusedRowsGroup& g = *r->second;
        if (t.name != g.parts[0]) continue;
        std::vector<ModelTensor> held;
        for (const std::string& m : g.parts) held.push_back(*by_name_.at(m));
        for (ModelTensor& m : held) m.dtype = t.dtype;
        std::vector<const ModelTensor*> parts;
        for (const ModelTensor& m : held) parts.push_back(&m);
        auto layouts = replica.Rows(parts);
        if (!layouts.ok()) return Bad(t.name, std::string(layouts.status().message()));
        for (size_t k = 0; k < parts.size(); ++k) SHARDSYNC_RETURN_IF_ERROR(Add(*parts[k], std::move((*layouts)[k])));
      } else {
        SHARDSYNC_ASSIGN_OR_RETURN(auto layout, replica.Plain(t));
        SHARDSYNC_RETURN_IF_ERROR(Add(t, std::move(layout)));
      }
    }
    return absl::OkStatus();
  }

  std::vector<Buffer> Buffers() const { return arena_.Buffers(); }

 private:
  bool Float8() const { return spec_.target_dtype == DType::kFloat8E4M3; }

  // `layout` into the target of the source tensor `t` reads (itself, or what it is tied
  // to), each float8 placement's scales after it in its rank's arena.
  absl::Status Add(const ModelTensor& t, Layout layout) {
    const std::string& name = t.tied_to.empty() ? t.name : t.tied_to;
    const auto it = index_.find(name);
    if (it == index_.end()) return Bad(t.name, absl::StrCat("is tied to '", name, "', which has no source"));
    TensorLayouts& target = input_.tensors[it->second];
    if (Quantized(t)) {
      if (target.target_dtype != DType::kFloat8E4M3) {
        return Bad(t.name, "a block-quantized target is tied to a tensor that is not");
      }
      for (const Placement& p : layout.placements) {
        const Index extent = Extent(p.box);
        const int64_t row_stride = ScaleBlocks(extent[1]);
        const int64_t base = arena_.Reserve(p.holder.rank, ScaleBlocks(extent[0]) * row_stride, DType::kFloat32);
        target.target_scales.push_back(BlockScales{p.holder, base, row_stride});
      }
    }
    Layout& into = target.target;
    into.placements.insert(into.placements.end(), layout.placements.begin(), layout.placements.end());
    into.fills.insert(into.fills.end(), layout.fills.begin(), layout.fills.end());
    return absl::OkStatus();
  }

  const ModelLayoutSpec& spec_;
  PlanInput& input_;
  const std::map<std::string, size_t>& index_;  // tensor name -> PlanInput::tensors
  ArenaPacker arena_;
  std::map<std::string, const ModelTensor*> by_name_;
  std::map<std::string, const FusedQkvGroup*> qkv_of_;
  std::map<std::string, const FusedRowsGroup*> rows_of_;
};

}  // namespace

absl::StatusOr<PlanInput> ExpandModel(const ModelLayoutSpec& spec) {
  if (spec.zero_stage < 1 || spec.zero_stage > 3) {
    return absl::InvalidArgumentError(absl::StrCat("zero_stage must be 1, 2 or 3, got ", spec.zero_stage));
  }
  if (spec.dp_ranks.empty()) return absl::InvalidArgumentError("a model layout needs at least one DP rank");
  SHARDSYNC_RETURN_IF_ERROR(CheckSizes(spec.tensors));
  PlanInput input;
  std::map<std::string, size_t> index;  // tensor name -> PlanInput::tensors
  TargetExpander targets(spec, input, index);
  SHARDSYNC_RETURN_IF_ERROR(targets.CheckNames());
  std::vector<const ModelTensor*> sourced;
  for (const ModelTensor& t : spec.tensors) {
    if (t.tied_to.empty()) sourced.push_back(&t);
  }
  SHARDSYNC_RETURN_IF_ERROR(AddSources(
      spec, sourced, [&](const ModelTensor& t) { return targets.TargetDtype(t); }, input, index));
  for (const std::vector<int32_t>& ranks : spec.replicas) SHARDSYNC_RETURN_IF_ERROR(targets.Replica(ranks));
  for (const Buffer& b : targets.Buffers()) input.buffers.push_back(b);
  return input;
}

}  // namespace shardsync::planner

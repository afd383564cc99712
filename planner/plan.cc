#include "planner/plan.h"

#include <algorithm>
#include <map>
#include <optional>
#include <type_traits>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/box.h"
#include "planner/cover.h"
#include "planner/validate.h"

namespace shardsync::planner {
namespace {

using internal::Candidate;
using internal::CoverCache;
using internal::Coverer;

class LocalFirstLeastLoadedPolicy final : public ReplicaPolicy {
 public:
  absl::string_view name() const override { return "local_first_least_loaded"; }
  size_t Choose(int32_t target_rank, absl::Span<const int32_t> ranks,
                absl::Span<const int64_t> sent_bytes) const override {
    size_t best = 0;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i] == target_rank) return i;
      const auto key = [&](size_t j) { return std::make_pair(sent_bytes[ranks[j]], ranks[j]); };
      if (key(i) < key(best)) best = i;
    }
    return best;
  }
};

class FirstHolderPolicy final : public ReplicaPolicy {
 public:
  absl::string_view name() const override { return "first_holder"; }
  size_t Choose(int32_t, absl::Span<const int32_t>, absl::Span<const int64_t>) const override { return 0; }
};

// Source placements of one tensor sorted by their first-axis start, for quick lookup
// of those meeting a target box.
struct SourceIndex {
  std::vector<int32_t> order;
  int64_t max_span = 0;  // longest first-axis extent of any source box
};

SourceIndex IndexSources(const TensorLayouts& t) {
  SourceIndex index;
  for (size_t i = 0; i < t.source.placements.size(); ++i) {
    const Box& b = t.source.placements[i].box;
    if (IsEmpty(b)) continue;
    index.order.push_back(static_cast<int32_t>(i));
    if (!b.lo.empty()) index.max_span = std::max(index.max_span, b.hi[0] - b.lo[0]);
  }
  if (!t.shape.empty()) {
    std::stable_sort(index.order.begin(), index.order.end(), [&](int32_t a, int32_t b) {
      return t.source.placements[a].box.lo[0] < t.source.placements[b].box.lo[0];
    });
  }
  return index;
}

// Boxes that differ only along one axis and touch there become one.
bool TryMergeBoxes(Box& into, const Box& next) {
  int differing = -1;
  for (size_t k = 0; k < into.lo.size(); ++k) {
    if (into.lo[k] == next.lo[k] && into.hi[k] == next.hi[k]) continue;
    if (differing >= 0 || into.hi[k] != next.lo[k]) return false;
    differing = static_cast<int>(k);
  }
  if (differing < 0) return false;
  into.hi[differing] = next.hi[differing];
  return true;
}

int64_t OffsetOf(const Placement& p, const Index& at) {
  int64_t offset = p.base;
  for (size_t k = 0; k < at.size(); ++k) offset += (at[k] - p.box.lo[k]) * p.strides[k];
  return offset;
}

// The segment moving `box` from placement `src` (a source, or in stage 1 a target
// another rank wrote in stage 0) to placement `dst`.
Segment MakeSegment(int32_t tensor, const Placement& src, DType src_dtype, const Placement& dst, DType dst_dtype,
                    const Box& box, int8_t stage) {
  Segment s;
  s.tensor = tensor;
  s.stage = stage;
  s.src = src.holder;
  s.dst = dst.holder;
  s.src_base = OffsetOf(src, box.lo);
  s.dst_base = OffsetOf(dst, box.lo);
  s.src_dtype = src_dtype;
  s.dst_dtype = dst_dtype;
  // Drop extent-1 axes; merge an axis into the previous one when both sides are contiguous.
  for (size_t k = 0; k < box.lo.size(); ++k) {
    const int64_t n = box.hi[k] - box.lo[k];
    if (n == 1) continue;
    const int last = s.axes - 1;
    if (s.axes > 0 && s.src_strides[last] == n * src.strides[k] && s.dst_strides[last] == n * dst.strides[k] &&
        s.shape[last] * n <= kMaxSegmentAxis) {
      s.shape[last] = static_cast<SegmentAxis>(s.shape[last] * n);
      s.src_strides[last] = static_cast<SegmentAxis>(src.strides[k]);
      s.dst_strides[last] = static_cast<SegmentAxis>(dst.strides[k]);
      continue;
    }
    s.shape[s.axes] = static_cast<SegmentAxis>(n);  // each fits: ValidatePlanInput
    s.src_strides[s.axes] = static_cast<SegmentAxis>(src.strides[k]);
    s.dst_strides[s.axes] = static_cast<SegmentAxis>(dst.strides[k]);
    ++s.axes;
  }
  if (s.axes == 0) {  // a single element
    s.axes = 1;
    s.shape[0] = 1;
    s.src_strides[0] = s.dst_strides[0] = 1;
  }
  return s;
}

bool IsRun(const Segment& s) { return s.axes == 1 && s.src_strides[0] == 1 && s.dst_strides[0] == 1; }

// Appends `next` to `into` when both are contiguous runs that continue each other.
bool TryMergeRuns(Segment& into, const Segment& next) {
  if (!IsRun(into) || !IsRun(next) || !(into.src == next.src) || !(into.dst == next.dst) ||
      into.tensor != next.tensor || into.stage != next.stage || into.src_base + into.shape[0] != next.src_base ||
      into.dst_base + into.shape[0] != next.dst_base || int64_t{into.shape[0]} + next.shape[0] > kMaxSegmentAxis) {
    return false;
  }
  into.shape[0] += next.shape[0];
  return true;
}

// A piece held by several sources: its segment is made once the policy has chosen.
struct Pending {
  size_t segment;  // position reserved among its tensor's segments
  int32_t tensor;
  int32_t target;
  Box box;
  uint32_t sources_begin;  // into the sources pool
  uint32_t sources_count;
};

// Target placements of one tensor that hold the same box on the same node (replicas of
// a shard there), for the relay: a group is named by its first placement, its lead.
// Their pieces are the same (the same box met by the same sources), so a piece's
// relay is chosen once, while the lead is covered, and looked up by the piece's
// position for the others.
class ReplicaGroups {
 public:
  ReplicaGroups(const TensorLayouts& t, absl::Span<const int32_t> node_of_rank)
      : lead_(t.target.placements.size(), -1) {
    std::map<std::pair<int32_t, std::vector<int64_t>>, int32_t> lead_of;
    for (size_t i = 0; i < t.target.placements.size(); ++i) {
      const Placement& p = t.target.placements[i];
      if (IsEmpty(p.box)) continue;  // never covered
      std::vector<int64_t> key(p.box.lo.begin(), p.box.lo.end());
      key.insert(key.end(), p.box.hi.begin(), p.box.hi.end());
      const int32_t lead = lead_of.emplace(std::make_pair(node_of_rank[p.holder.rank], key), i).first->second;
      lead_[i] = lead;
      members_[lead].push_back(static_cast<int32_t>(i));
    }
    for (auto it = members_.begin(); it != members_.end();)
      it = it->second.size() < 2 ? members_.erase(it) : std::next(it);
  }
  // The members of placement i's group (itself first if it leads), or none when alone.
  const std::vector<int32_t>* Members(int32_t i) const {
    auto it = members_.find(lead_[i]);
    return it == members_.end() ? nullptr : &it->second;
  }
  int32_t Lead(int32_t i) const { return lead_[i]; }
  // By piece position: the member that receives the piece over the network, or -1 when
  // the node holds a source of it (each member reads it there).
  std::vector<int32_t>& Relays(int32_t lead) { return relays_[lead]; }

 private:
  std::vector<int32_t> lead_;
  std::map<int32_t, std::vector<int32_t>> members_;
  std::map<int32_t, std::vector<int32_t>> relays_;
};

// The member of a replica group that takes a piece of `bytes` across the network: the
// one whose rank receives the fewest bytes from other nodes so far (ties to the lowest
// rank), charged for it.
int32_t ChooseRelay(const TensorLayouts& t, const std::vector<int32_t>& members, int64_t bytes,
                    std::vector<int64_t>& from_network) {
  const auto load = [&](int32_t m) {
    const int32_t rank = t.target.placements[m].holder.rank;
    return std::make_pair(from_network[rank], rank);
  };
  const int32_t relay =
      *std::min_element(members.begin(), members.end(), [&](int32_t a, int32_t b) { return load(a) < load(b); });
  from_network[t.target.placements[relay].holder.rank] += bytes;
  return relay;
}

bool SpansNodes(absl::Span<const int32_t> node_of_rank) {
  return std::any_of(node_of_rank.begin(), node_of_rank.end(), [&](int32_t n) { return n != node_of_rank[0]; });
}

}  // namespace

Segment FillRegion(const FillOp& f) {
  Segment region;
  region.tensor = f.tensor;
  region.src = region.dst = f.fill.holder;
  region.src_base = region.dst_base = f.fill.base;
  region.src_dtype = region.dst_dtype = f.dtype;
  region.axes = static_cast<int8_t>(std::max<size_t>(1, f.fill.shape.size()));  // a scalar: one element
  region.shape.fill(1);
  region.src_strides.fill(1);
  for (size_t k = 0; k < f.fill.shape.size(); ++k) {
    region.shape[k] = static_cast<SegmentAxis>(f.fill.shape[k]);  // each fits: ValidatePlanInput
    region.src_strides[k] = static_cast<SegmentAxis>(f.fill.strides[k]);
  }
  region.dst_strides = region.src_strides;
  return region;
}

int64_t SegmentElements(const Segment& segment) {
  int64_t n = 1;
  for (int k = 0; k < segment.axes; ++k) n *= segment.shape[k];
  return n;
}
int64_t SegmentBytes(const Segment& segment) { return SegmentElements(segment) * ElementBytes(segment.dst_dtype); }

std::unique_ptr<ReplicaPolicy> LocalFirstLeastLoaded() { return std::make_unique<LocalFirstLeastLoadedPolicy>(); }
std::unique_ptr<ReplicaPolicy> FirstHolder() { return std::make_unique<FirstHolderPolicy>(); }

absl::StatusOr<std::vector<TensorLayouts>> MatchTensors(const std::vector<TensorSide>& sources,
                                                        const std::vector<TensorSide>& targets) {
  std::map<std::string, const TensorSide*> by_name;
  for (const TensorSide& s : sources) {
    if (!by_name.emplace(s.name, &s).second) {
      return absl::InvalidArgumentError(absl::StrCat("source tensor '", s.name, "' is registered twice"));
    }
  }
  std::vector<TensorLayouts> out;
  std::map<std::string, int> seen;
  for (const TensorSide& t : targets) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return absl::NotFoundError(absl::StrCat("target tensor '", t.name, "' has no source of that name"));
    }
    if (seen[t.name]++ > 0) {
      return absl::InvalidArgumentError(absl::StrCat("target tensor '", t.name, "' is registered twice"));
    }
    const TensorSide& s = *it->second;
    if (s.shape != t.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': shape mismatch, source ",
                                                     IndexToString(s.shape), ", target ", IndexToString(t.shape)));
    }
    out.push_back(TensorLayouts{t.name, t.shape, s.dtype, t.dtype, s.layout, t.layout, t.scales});
  }
  return out;
}

namespace {

// The source placements of `t` whose boxes meet `box`, clipped to it, into `out`: only
// those whose first-axis range can reach it (`index` orders them by their start).
void GatherCandidates(const TensorLayouts& t, const SourceIndex& index, const Box& box, std::vector<Candidate>& out) {
  out.clear();
  auto first = index.order.begin();
  auto last = index.order.end();
  if (!t.shape.empty()) {
    const auto lo0 = [&](int32_t i) { return t.source.placements[i].box.lo[0]; };
    first = std::partition_point(first, last, [&](int32_t i) { return lo0(i) < box.lo[0] - index.max_span; });
    last = std::partition_point(first, last, [&](int32_t i) { return lo0(i) < box.hi[0]; });
  }
  for (auto it = first; it != last; ++it) {
    Box clip = Intersect(t.source.placements[*it].box, box);
    if (!IsEmpty(clip)) out.push_back(Candidate{*it, std::move(clip)});
  }
}

// Phase 2: pieces held by several sources, chosen by the policy in canonical order, with
// every forced load already counted in `sent`; each fills the segment it reserved.
template <typename Segments>
void ChoosePending(const PlanInput& input, const std::vector<Pending>& pending, const std::vector<int32_t>& pool,
                   const ReplicaPolicy& policy, const std::vector<int8_t>& first_stage, std::vector<int64_t>& sent,
                   Segments& segments) {
  std::vector<int32_t> ranks;
  for (const Pending& p : pending) {
    const TensorLayouts& t = input.tensors[p.tensor];
    const Placement& target = t.target.placements[p.target];
    ranks.clear();
    for (uint32_t i = 0; i < p.sources_count; ++i)
      ranks.push_back(t.source.placements[pool[p.sources_begin + i]].holder.rank);
    const size_t pick = policy.Choose(target.holder.rank, ranks, sent);
    if (ranks[pick] != target.holder.rank) sent[ranks[pick]] += Volume(p.box) * ElementBytes(t.target_dtype);
    segments[p.segment] = MakeSegment(p.tensor, t.source.placements[pool[p.sources_begin + pick]], t.source_dtype,
                                      target, t.target_dtype, p.box, first_stage.empty() ? 0 : first_stage[p.tensor]);
  }
}

// Contiguous runs that continue each other become one segment (forced ones are merged
// as they are made; this pass is for those phase 2 made). Segments move only after the
// first merge.
template <typename Segments>
void MergeRuns(Segments& segments) {
  size_t kept = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (kept > 0 && TryMergeRuns(segments[kept - 1], segments[i])) continue;
    if (kept != i) segments[kept] = segments[i];
    ++kept;
  }
  segments.resize(kept);
}

// Every target fill with elements, as the plan's fill ops.
void AddFills(const PlanInput& input, Plan& plan) {
  for (size_t ti = 0; ti < input.tensors.size(); ++ti) {
    const TensorLayouts& t = input.tensors[ti];
    for (const Fill& f : t.target.fills) {
      if (NumElements(f.shape) > 0) plan.fills.push_back(FillOp{static_cast<int32_t>(ti), f, t.target_dtype});
    }
  }
}

// How a pass goes over the batch. kWhole (MakePlan): every segment kept, forced
// pieces counted as they are made, the shared ones chosen at the end. StreamPlan's two
// passes make the same choices with one tensor's segments at a time: kForcedLoads
// counts the forced pieces alone, then kTensorByTensor makes each tensor's segments
// and chooses its shared pieces with every forced piece of the batch counted.
enum class Pass { kWhole, kForcedLoads, kTensorByTensor };

// What a pass carries from tensor to tensor.
template <typename Segments>
struct PassState {
  const PlanInput& input;
  const std::vector<int8_t>& first_stage;  // by tensor; empty: every tensor starts in stage 0
  bool counting;                           // forced pieces load their senders in this pass
  bool making;                             // segments are made in this pass
  bool many_nodes;
  Plan& plan;
  Segments& segments;
  std::vector<int64_t>& sent;         // bytes each rank sends so far
  std::vector<int64_t> from_network;  // bytes each rank receives from other nodes so far
  std::vector<Pending> pending;
  std::vector<int32_t> pool;  // sources of pending pieces
  std::vector<int32_t> near;  // a piece's sources on the target's node
  size_t made_from = 0;       // segments from here on are made (none waits for phase 2)

  int32_t Node(int32_t rank) const { return many_nodes ? input.node_of_rank[rank] : 0; }
};

// Phase 1 of one target placement: its pieces in cover order. A piece with one holder
// (or a relay in its replica group) is forced: its segment is made at once, merged
// with the one before where their boxes join, and loads its sender. A piece with
// several holders keeps its place for phase 2.
template <typename Segments>
class PlacementCover {
 public:
  PlacementCover(PassState<Segments>& state, int32_t tensor, int32_t placement, ReplicaGroups* groups)
      : state_(state),
        tensor_(tensor),
        t_(state.input.tensors[tensor]),
        me_(placement),
        target_(t_.target.placements[placement]),
        members_(groups ? groups->Members(placement) : nullptr),
        relays_(members_ ? &groups->Relays(groups->Lead(placement)) : nullptr),
        lead_(members_ && groups->Lead(placement) == placement) {}

  void Emit(const Box& box, absl::Span<const int32_t> sources) {
    const int64_t bytes = Volume(box) * ElementBytes(t_.target_dtype);
    absl::Span<const int32_t> usable = sources;
    bool remote = false;
    if (state_.many_nodes) {
      std::vector<int32_t>& near = state_.near;
      near.clear();
      for (int32_t s : sources) {
        if (state_.Node(t_.source.placements[s].holder.rank) == state_.Node(target_.holder.rank)) near.push_back(s);
      }
      remote = near.empty();
      if (!remote) usable = near;
    }
    int32_t relay = -1;  // this piece's relay in the group, if it has one
    if (relays_ != nullptr) {
      if (lead_) relays_->push_back(remote ? ChooseRelay(t_, *members_, bytes, state_.from_network) : -1);
      if (position_ >= relays_->size()) {
        misaligned_ = true;
        return;
      }
      relay = (*relays_)[position_];
    } else if (remote) {
      state_.from_network[target_.holder.rank] += bytes;
    }
    ++position_;
    if (relay >= 0 && relay != me_) return Force(t_.target.placements[relay], 1, box, bytes);
    if (usable.size() == 1) return Force(t_.source.placements[usable[0]], 0, box, bytes);
    if (!state_.making) return;  // chosen in the next pass
    Flush();
    state_.pending.push_back(Pending{state_.segments.size(), tensor_, me_, box,
                                     static_cast<uint32_t>(state_.pool.size()), static_cast<uint32_t>(usable.size())});
    state_.pool.insert(state_.pool.end(), usable.begin(), usable.end());
    state_.segments.emplace_back();  // made in phase 2
    state_.made_from = state_.segments.size();
  }

  // After the last piece: the open segment made; INTERNAL when the replicas of a box
  // were cut into different pieces (the relay needs them alike).
  absl::Status Finish() {
    if (misaligned_ || (relays_ != nullptr && position_ != relays_->size())) {
      return absl::InternalError(absl::StrCat("tensor '", t_.name, "': replicas of one box on rank ",
                                              target_.holder.rank, " were cut into different pieces"));
    }
    Flush();
    return absl::OkStatus();
  }

 private:
  void Force(const Placement& from, int8_t stage, const Box& box, int64_t bytes) {
    if (state_.counting && from.holder.rank != target_.holder.rank) state_.sent[from.holder.rank] += bytes;
    if (open_from_ == &from && TryMergeBoxes(open_box_, box)) return;
    Flush();
    open_from_ = &from;
    open_stage_ = stage;
    open_box_ = box;
  }

  void Flush() {
    if (open_from_ == nullptr || !state_.making) return;
    const DType from_dtype = open_stage_ == 0 ? t_.source_dtype : t_.target_dtype;
    const int8_t first = state_.first_stage.empty() ? 0 : state_.first_stage[tensor_];
    const Segment made = MakeSegment(tensor_, *open_from_, from_dtype, target_, t_.target_dtype, open_box_,
                                     static_cast<int8_t>(first + open_stage_));
    state_.plan.stages = std::max(state_.plan.stages, made.stage + 1);
    Segments& segments = state_.segments;
    if (segments.size() <= state_.made_from || !TryMergeRuns(segments.back(), made)) segments.push_back(made);
    open_from_ = nullptr;
  }

  PassState<Segments>& state_;
  const int32_t tensor_;
  const TensorLayouts& t_;
  const int32_t me_;
  const Placement& target_;
  const std::vector<int32_t>* const members_;  // its replica group on its node, if any
  std::vector<int32_t>* const relays_;         // the group's relay of each piece
  const bool lead_;
  size_t position_ = 0;  // of the piece in cover order: the same in every member
  bool misaligned_ = false;
  const Placement* open_from_ = nullptr;  // the forced piece not yet made a segment
  int8_t open_stage_ = 0;
  Box open_box_;
};

// A pass on validated input, its segments in `segments` (kWhole: all; kTensorByTensor:
// each tensor's in turn, handed to `sink`). `first_stage` gives each tensor's first
// stage (see Segment), `quantized` the tensors that are never relayed; both empty:
// every tensor starts in stage 0 and may be relayed. `sent`: the bytes each rank sends
// so far (kTensorByTensor: from kForcedLoads' count).
template <typename Segments>
absl::StatusOr<Plan> PlanStages(const PlanInput& input, const std::vector<int8_t>& first_stage,
                                const std::vector<bool>& quantized, const ReplicaPolicy& policy,
                                const PlanOptions& options, Pass pass, std::vector<int64_t>& sent, Segments& segments,
                                const SegmentSink& sink) {
  Plan plan;
  plan.node_of_rank = input.node_of_rank;
  plan.num_ranks = NumRanks(input);
  sent.resize(plan.num_ranks, 0);
  const bool by_tensor = pass == Pass::kTensorByTensor;
  PassState<Segments> state{input,
                            first_stage,
                            !by_tensor,
                            pass != Pass::kForcedLoads,
                            SpansNodes(input.node_of_rank),
                            plan,
                            segments,
                            sent,
                            std::vector<int64_t>(plan.num_ranks, 0),
                            {},
                            {},
                            {},
                            0};
  Coverer coverer;
  CoverCache covers;
  // Tensor by tensor: phase 1 covers every target box in canonical order (PlacementCover);
  // phase 2 chooses the holders of the shared pieces, once the forced ones are counted.
  for (size_t ti = 0; ti < input.tensors.size(); ++ti) {
    const TensorLayouts& t = input.tensors[ti];
    if (by_tensor) {
      segments.clear();
      state.pending.clear();
      state.pool.clear();
      state.made_from = 0;
    }
    plan.tensor_names.push_back(t.name);
    const SourceIndex index = IndexSources(t);
    covers.StartTensor(t);
    std::optional<ReplicaGroups> groups;
    if (options.relay && state.many_nodes && (quantized.empty() || !quantized[ti])) {
      groups.emplace(t, input.node_of_rank);
    }
    for (size_t pi = 0; pi < t.target.placements.size(); ++pi) {
      const Placement& target = t.target.placements[pi];
      if (IsEmpty(target.box)) continue;
      Box uncovered;
      const CoverCache::Pieces* pieces = covers.Find(target.box);
      if (pieces == nullptr) {
        GatherCandidates(t, index, target.box, coverer.candidates());
        pieces = covers.Cover(coverer, target.box, &uncovered);
      }
      if (pieces == nullptr) {
        absl::Status status = absl::FailedPreconditionError(
            absl::StrCat("tensor '", t.name, "': the target in ", BufferLabel(input, target.holder),
                         " has no source for box ", BoxToString(uncovered)));
        status.SetPayload(kUncoveredTensorPayload, absl::Cord(t.name));
        return status;
      }
      PlacementCover<Segments> cover(state, static_cast<int32_t>(ti), static_cast<int32_t>(pi),
                                     groups ? &*groups : nullptr);
      for (const CoverCache::Piece& piece : *pieces) cover.Emit(piece.box, covers.Sources(piece));
      SHARDSYNC_RETURN_IF_ERROR(cover.Finish());
    }
    if (!by_tensor) continue;
    ChoosePending(input, state.pending, state.pool, policy, first_stage, sent, segments);
    if (!state.pending.empty()) MergeRuns(segments);
    if constexpr (std::is_same_v<Segments, std::vector<Segment>>) SHARDSYNC_RETURN_IF_ERROR(sink(segments));
  }
  if (pass == Pass::kWhole) {
    ChoosePending(input, state.pending, state.pool, policy, first_stage, sent, segments);
    if (!state.pending.empty()) MergeRuns(segments);
  }
  AddFills(input, plan);
  return plan;
}

// Checks `input`, then plans it through `passes` (the planning of a PlanInput, given
// its tensors' first stages and those never relayed): block-quantized targets first go
// through scratch (planner/quantize.h).
absl::StatusOr<Plan> PlanWithScratch(
    const PlanInput& input, const PlanOptions& options,
    const std::function<absl::StatusOr<Plan>(const PlanInput&, const std::vector<int8_t>&, const std::vector<bool>&)>&
        passes) {
  SHARDSYNC_RETURN_IF_ERROR(ValidatePlanInput(input));
  const bool quantizes = std::any_of(input.tensors.begin(), input.tensors.end(),
                                     [](const TensorLayouts& t) { return !t.target_scales.empty(); });
  if (!quantizes) return passes(input, {}, {});
  SHARDSYNC_ASSIGN_OR_RETURN(ScratchLayout scratch, PlaceScratch(input, options.scratch_bytes));
  SHARDSYNC_ASSIGN_OR_RETURN(Plan plan, passes(scratch.input, scratch.first_stage, scratch.quantized));
  for (const QuantizeOp& q : scratch.quantizes) plan.stages = std::max<int32_t>(plan.stages, q.stage + 1);
  plan.scratch = std::move(scratch.scratch);
  plan.quantizes = std::move(scratch.quantizes);
  return plan;
}

}  // namespace

absl::StatusOr<Plan> StreamPlan(const PlanInput& input, const ReplicaPolicy& policy, const PlanOptions& options,
                                const SegmentSink& sink) {
  return PlanWithScratch(
      input, options,
      [&](const PlanInput& in, const std::vector<int8_t>& first_stage,
          const std::vector<bool>& quantized) -> absl::StatusOr<Plan> {
        std::vector<int64_t> sent;
        std::vector<Segment> segments;  // one tensor's, reused
        SHARDSYNC_RETURN_IF_ERROR(
            PlanStages(in, first_stage, quantized, policy, options, Pass::kForcedLoads, sent, segments, sink).status());
        return PlanStages(in, first_stage, quantized, policy, options, Pass::kTensorByTensor, sent, segments, sink);
      });
}

absl::StatusOr<Plan> MakePlan(const PlanInput& input, const ReplicaPolicy& policy, const PlanOptions& options) {
  return PlanWithScratch(input, options,
                         [&](const PlanInput& in, const std::vector<int8_t>& first_stage,
                             const std::vector<bool>& quantized) -> absl::StatusOr<Plan> {
                           std::vector<int64_t> sent;
                           BlockVector<Segment> segments;
                           SHARDSYNC_ASSIGN_OR_RETURN(Plan plan, PlanStages(in, first_stage, quantized, policy, options,
                                                                            Pass::kWhole, sent, segments, nullptr));
                           plan.segments = std::move(segments);
                           return plan;
                         });
}

}  // namespace shardsync::planner

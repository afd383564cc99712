#include "planner/plan.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "planner/box.h"
#include "planner/validate.h"

namespace shardsync::planner {
namespace {

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

// A box of one target placement and the source placements that hold all of it.
struct Piece {
  int32_t tensor;
  int32_t target;
  Box box;
  uint32_t candidates_begin;
  uint32_t candidates_count;
  int32_t chosen = -1;  // source placement index
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

struct Candidate {
  int32_t source;
  Box box;  // the source box clipped to the target box
};

// Splits `region` into pieces, each with the candidates holding all of it: a sweep over
// axis `axis` of the candidate boundaries, recursing into each slab on the next axis.
// Returns false at the first uncovered box (in *uncovered).
class Coverer {
 public:
  Coverer(std::vector<Candidate> candidates, std::vector<int32_t>* pool) : cands_(std::move(candidates)), pool_(pool) {}

  bool Cover(const Box& region, const std::vector<int32_t>& active, size_t axis,
             std::vector<std::pair<Box, std::pair<uint32_t, uint32_t>>>* out, Box* uncovered) {
    if (active.empty()) {
      *uncovered = region;
      return false;
    }
    if (active.size() == 1 || axis == region.lo.size()) {
      std::vector<int32_t> holding;
      for (int32_t c : active) {
        if (Contains(cands_[c].box, region)) holding.push_back(cands_[c].source);
      }
      if (!holding.empty()) {
        std::sort(holding.begin(), holding.end());
        out->push_back({region, {static_cast<uint32_t>(pool_->size()), static_cast<uint32_t>(holding.size())}});
        pool_->insert(pool_->end(), holding.begin(), holding.end());
        return true;
      }
      if (axis == region.lo.size()) {
        *uncovered = region;
        return false;
      }
    }
    // Boundaries of the active candidates along `axis`, inside the region.
    std::vector<int64_t> cuts{region.lo[axis], region.hi[axis]};
    for (int32_t c : active) {
      cuts.push_back(std::clamp(cands_[c].box.lo[axis], region.lo[axis], region.hi[axis]));
      cuts.push_back(std::clamp(cands_[c].box.hi[axis], region.lo[axis], region.hi[axis]));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<int32_t> by_start = active;
    std::sort(by_start.begin(), by_start.end(),
              [&](int32_t a, int32_t b) { return cands_[a].box.lo[axis] < cands_[b].box.lo[axis]; });
    std::vector<int32_t> live;
    size_t next = 0;
    for (size_t s = 0; s + 1 < cuts.size(); ++s) {
      const int64_t lo = cuts[s], hi = cuts[s + 1];
      live.erase(std::remove_if(live.begin(), live.end(), [&](int32_t c) { return cands_[c].box.hi[axis] <= lo; }),
                 live.end());
      while (next < by_start.size() && cands_[by_start[next]].box.lo[axis] <= lo) {
        if (cands_[by_start[next]].box.hi[axis] > lo) live.push_back(by_start[next]);
        ++next;
      }
      Box slab = region;
      slab.lo[axis] = lo;
      slab.hi[axis] = hi;
      if (!Cover(slab, live, axis + 1, out, uncovered)) return false;
    }
    return true;
  }

 private:
  std::vector<Candidate> cands_;
  std::vector<int32_t>* pool_;
};

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

Segment MakeSegment(int32_t tensor, const TensorLayouts& t, const Placement& src, const Placement& dst,
                    const Box& box) {
  Segment s;
  s.tensor = tensor;
  s.src = src.holder;
  s.dst = dst.holder;
  s.src_base = OffsetOf(src, box.lo);
  s.dst_base = OffsetOf(dst, box.lo);
  s.src_dtype = t.source_dtype;
  s.dst_dtype = t.target_dtype;
  // Drop extent-1 axes; merge an axis into the previous one when both sides are contiguous.
  for (size_t k = 0; k < box.lo.size(); ++k) {
    const int64_t n = box.hi[k] - box.lo[k];
    if (n == 1) continue;
    if (!s.shape.empty() && s.src_strides.back() == n * src.strides[k] &&
        s.dst_strides.back() == n * dst.strides[k]) {
      s.shape.back() *= n;
      s.src_strides.back() = src.strides[k];
      s.dst_strides.back() = dst.strides[k];
      continue;
    }
    s.shape.push_back(n);
    s.src_strides.push_back(src.strides[k]);
    s.dst_strides.push_back(dst.strides[k]);
  }
  if (s.shape.empty()) {  // a single element
    s.shape = {1};
    s.src_strides = {1};
    s.dst_strides = {1};
  }
  return s;
}

// Appends `next` to `into` when both are contiguous runs that continue each other.
bool TryMergeRuns(Segment& into, const Segment& next) {
  if (into.shape.size() != 1 || next.shape.size() != 1 || into.src_strides[0] != 1 || into.dst_strides[0] != 1 ||
      next.src_strides[0] != 1 || next.dst_strides[0] != 1 || !(into.src == next.src) || !(into.dst == next.dst) ||
      into.tensor != next.tensor || into.src_base + into.shape[0] != next.src_base ||
      into.dst_base + into.shape[0] != next.dst_base) {
    return false;
  }
  into.shape[0] += next.shape[0];
  return true;
}

}  // namespace

int64_t SegmentElements(const Segment& segment) { return NumElements(segment.shape); }
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
    out.push_back(TensorLayouts{t.name, t.shape, s.dtype, t.dtype, s.layout, t.layout});
  }
  return out;
}

absl::StatusOr<Plan> MakePlan(const PlanInput& input, const ReplicaPolicy& policy) {
  if (auto s = ValidatePlanInput(input); !s.ok()) return s;
  Plan plan;
  for (const Buffer& b : input.buffers) plan.num_ranks = std::max(plan.num_ranks, b.holder.rank + 1);
  std::vector<int64_t> sent(plan.num_ranks, 0);
  std::vector<Piece> pieces;
  std::vector<int32_t> pool;  // candidate source indices of every piece
  std::vector<std::pair<Box, std::pair<uint32_t, uint32_t>>> covered;

  // Phase 1: cover every target box; pieces with one holder are forced and load it.
  for (size_t ti = 0; ti < input.tensors.size(); ++ti) {
    const TensorLayouts& t = input.tensors[ti];
    plan.tensor_names.push_back(t.name);
    const int64_t element = ElementBytes(t.target_dtype);
    const SourceIndex index = IndexSources(t);
    for (size_t pi = 0; pi < t.target.placements.size(); ++pi) {
      const Placement& target = t.target.placements[pi];
      if (IsEmpty(target.box)) continue;
      std::vector<Candidate> cands;
      auto first = index.order.begin();
      auto last = index.order.end();
      if (!t.shape.empty()) {
        const auto lo0 = [&](int32_t i) { return t.source.placements[i].box.lo[0]; };
        first = std::partition_point(first, last, [&](int32_t i) { return lo0(i) < target.box.lo[0] - index.max_span; });
        last = std::partition_point(first, last, [&](int32_t i) { return lo0(i) < target.box.hi[0]; });
      }
      for (auto it = first; it != last; ++it) {
        Box clip = Intersect(t.source.placements[*it].box, target.box);
        if (!IsEmpty(clip)) cands.push_back(Candidate{*it, std::move(clip)});
      }
      std::vector<int32_t> active(cands.size());
      for (size_t c = 0; c < cands.size(); ++c) active[c] = static_cast<int32_t>(c);
      covered.clear();
      Box uncovered;
      Coverer coverer(std::move(cands), &pool);
      if (!coverer.Cover(target.box, active, 0, &covered, &uncovered)) {
        return absl::FailedPreconditionError(absl::StrCat("tensor '", t.name, "': target on rank ",
                                                          target.holder.rank, " buffer ", target.holder.buffer,
                                                          " has no source for box ", BoxToString(uncovered)));
      }
      for (auto& [box, range] : covered) {
        Piece piece{static_cast<int32_t>(ti), static_cast<int32_t>(pi), box, range.first, range.second};
        if (range.second == 1) {
          piece.chosen = pool[range.first];
          const int32_t from = t.source.placements[piece.chosen].holder.rank;
          if (from != target.holder.rank) sent[from] += Volume(box) * element;
        }
        pieces.push_back(std::move(piece));
      }
    }
  }

  // Phase 2: pieces held by several holders, chosen by the policy in canonical order.
  std::vector<int32_t> ranks;
  for (Piece& piece : pieces) {
    if (piece.chosen >= 0) continue;
    const TensorLayouts& t = input.tensors[piece.tensor];
    const int32_t target_rank = t.target.placements[piece.target].holder.rank;
    ranks.clear();
    for (uint32_t i = 0; i < piece.candidates_count; ++i) {
      ranks.push_back(t.source.placements[pool[piece.candidates_begin + i]].holder.rank);
    }
    const size_t pick = policy.Choose(target_rank, ranks, sent);
    piece.chosen = pool[piece.candidates_begin + pick];
    if (ranks[pick] != target_rank) sent[ranks[pick]] += Volume(piece.box) * ElementBytes(t.target_dtype);
  }

  // Segments: neighbouring boxes of one source and target merge, then contiguous runs.
  for (size_t i = 0; i < pieces.size();) {
    const Piece& head = pieces[i];
    Box box = head.box;
    size_t j = i + 1;
    while (j < pieces.size() && pieces[j].tensor == head.tensor && pieces[j].target == head.target &&
           pieces[j].chosen == head.chosen && TryMergeBoxes(box, pieces[j].box)) {
      ++j;
    }
    const TensorLayouts& t = input.tensors[head.tensor];
    Segment segment =
        MakeSegment(head.tensor, t, t.source.placements[head.chosen], t.target.placements[head.target], box);
    if (plan.segments.empty() || !TryMergeRuns(plan.segments.back(), segment)) {
      plan.segments.push_back(std::move(segment));
    }
    i = j;
  }
  for (size_t ti = 0; ti < input.tensors.size(); ++ti) {
    const TensorLayouts& t = input.tensors[ti];
    for (const Fill& f : t.target.fills) {
      if (NumElements(f.shape) > 0) plan.fills.push_back(FillOp{static_cast<int32_t>(ti), f, t.target_dtype});
    }
  }
  return plan;
}

}  // namespace shardsync::planner

// Covering a target box with source boxes: the geometric core of planning, apart from
// who sends what (plan.cc). Internal to the planner.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "planner/box.h"
#include "planner/types.h"

namespace shardsync::planner::internal {

struct Candidate {
  int32_t source;
  Box box;  // the source box clipped to the target box
};

// Splits a target box into pieces, each with the sources that hold all of it: a sweep
// over axis 0 of the candidates' boundaries, recursing into each slab on the next axis.
// Scratch space lives between calls, so steady-state planning allocates nothing.
class Coverer {
 public:
  std::vector<Candidate>& candidates() { return cands_; }

  // Calls emit(box, sources) for every piece, in row-major order of the pieces. Returns
  // false at the first box no candidate covers (in *uncovered).
  template <typename Emit>
  bool Cover(const Box& target, Emit&& emit, Box* uncovered) {
    all_.resize(cands_.size());
    for (size_t c = 0; c < cands_.size(); ++c) all_[c] = static_cast<int32_t>(c);
    if (levels_.size() < target.lo.size() + 1) levels_.resize(target.lo.size() + 1);
    return CoverAxis(target, all_, 0, emit, uncovered);
  }

 private:
  struct Level {
    std::vector<int64_t> cuts;
    std::vector<int32_t> by_start;
    std::vector<int32_t> live;
  };

  template <typename Emit>
  bool CoverAxis(const Box& region, const std::vector<int32_t>& active, size_t axis, Emit& emit, Box* uncovered) {
    if (active.empty()) {
      *uncovered = region;
      return false;
    }
    if (active.size() == 1 || axis == region.lo.size()) {
      holding_.clear();
      for (int32_t c : active) {
        if (Contains(cands_[c].box, region)) holding_.push_back(cands_[c].source);
      }
      if (!holding_.empty()) {
        std::sort(holding_.begin(), holding_.end());
        emit(region, absl::Span<const int32_t>(holding_));
        return true;
      }
      if (axis == region.lo.size()) {
        *uncovered = region;
        return false;
      }
    }
    Level& level = levels_[axis];  // the next axis uses levels_[axis + 1]
    level.cuts.assign({region.lo[axis], region.hi[axis]});
    for (int32_t c : active) {
      level.cuts.push_back(std::clamp(cands_[c].box.lo[axis], region.lo[axis], region.hi[axis]));
      level.cuts.push_back(std::clamp(cands_[c].box.hi[axis], region.lo[axis], region.hi[axis]));
    }
    std::sort(level.cuts.begin(), level.cuts.end());
    level.cuts.erase(std::unique(level.cuts.begin(), level.cuts.end()), level.cuts.end());
    level.by_start.assign(active.begin(), active.end());
    std::sort(level.by_start.begin(), level.by_start.end(),
              [&](int32_t a, int32_t b) { return cands_[a].box.lo[axis] < cands_[b].box.lo[axis]; });
    level.live.clear();
    size_t next = 0;
    Box slab = region;
    for (size_t s = 0; s + 1 < level.cuts.size(); ++s) {
      const int64_t lo = level.cuts[s], hi = level.cuts[s + 1];
      level.live.erase(
          std::remove_if(level.live.begin(), level.live.end(), [&](int32_t c) { return cands_[c].box.hi[axis] <= lo; }),
          level.live.end());
      while (next < level.by_start.size() && cands_[level.by_start[next]].box.lo[axis] <= lo) {
        if (cands_[level.by_start[next]].box.hi[axis] > lo) level.live.push_back(level.by_start[next]);
        ++next;
      }
      slab.lo[axis] = lo;
      slab.hi[axis] = hi;
      if (!CoverAxis(slab, level.live, axis + 1, emit, uncovered)) return false;
    }
    return true;
  }

  std::vector<Candidate> cands_;
  std::vector<int32_t> all_;
  std::vector<int32_t> holding_;
  std::vector<Level> levels_;
};

// The pieces of target boxes already covered, by the source boxes they were covered
// with: a cover depends on nothing else, so the replicas of a shard, and tensors laid
// out alike (every expert's gate, up and down of a model), are covered once. The few
// most recent source layouts are kept (a model interleaves a handful of them).
class CoverCache {
 public:
  struct Piece {
    Box box;
    uint32_t sources_begin;  // into the layout's sources
    uint32_t sources_count;
  };
  using Pieces = std::vector<Piece>;
  static constexpr size_t kLayouts = 8;

  // Selects the covers made with `t`'s source boxes, new ones if none are kept.
  void StartTensor(const TensorLayouts& t) {
    const auto& placements = t.source.placements;
    const auto same = [&](const KeptLayout& kept) {
      return kept.boxes.size() == placements.size() &&
             std::equal(placements.begin(), placements.end(), kept.boxes.begin(),
                        [](const Placement& p, const Box& b) { return p.box == b; });
    };
    if (current_ != nullptr && same(*current_)) return;
    for (KeptLayout& kept : layouts_) {
      if (same(kept)) {
        current_ = &kept;
        return;
      }
    }
    if (layouts_.size() == kLayouts) layouts_.erase(layouts_.begin());  // the oldest
    layouts_.emplace_back();
    current_ = &layouts_.back();
    for (const Placement& p : placements) current_->boxes.push_back(p.box);
  }
  const Pieces* Find(const Box& target) const {
    auto it = current_->covers.find(target);
    return it == current_->covers.end() ? nullptr : &it->second;
  }
  // Covers `target` with `coverer` (its candidates set) and keeps the pieces; null
  // when a part of it has no source (in *uncovered).
  const Pieces* Cover(Coverer& coverer, const Box& target, Box* uncovered) {
    Pieces pieces;
    std::vector<int32_t>& pool = current_->sources;
    const auto keep = [&](const Box& box, absl::Span<const int32_t> sources) {
      pieces.push_back(Piece{box, static_cast<uint32_t>(pool.size()), static_cast<uint32_t>(sources.size())});
      pool.insert(pool.end(), sources.begin(), sources.end());
    };
    if (!coverer.Cover(target, keep, uncovered)) return nullptr;
    return &(current_->covers[target] = std::move(pieces));
  }
  absl::Span<const int32_t> Sources(const Piece& piece) const {
    return absl::Span<const int32_t>(current_->sources.data() + piece.sources_begin, piece.sources_count);
  }

 private:
  struct KeptLayout {
    std::vector<Box> boxes;  // the source boxes the covers were made with
    absl::flat_hash_map<Box, Pieces> covers;
    std::vector<int32_t> sources;
  };
  std::deque<KeptLayout> layouts_;  // oldest first; a deque keeps current_ valid as it grows
  KeptLayout* current_ = nullptr;
};

}  // namespace shardsync::planner::internal

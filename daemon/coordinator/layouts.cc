#include "daemon/coordinator/layouts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "planner/box.h"

namespace shardsync::coordinator {
namespace {

// One side of a tensor gathered over ranks: the first publisher fixes shape and dtype.
struct Gathered {
  planner::TensorSide side;
  int32_t first_rank = 0;
};

absl::Status Merge(std::map<std::string, Gathered>& into, const v1::TensorLayout& layout, int32_t rank,
                   spec::BufferIds& ids) {
  auto side = spec::ToTensorSide(layout, ids);
  if (!side.ok()) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": ", side.status().message()));
  auto [it, added] = into.emplace(side->name, Gathered{*side, rank});
  if (added) return absl::OkStatus();
  planner::TensorSide& have = it->second.side;
  if (have.shape != side->shape || have.dtype != side->dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", side->name, "': rank ", it->second.first_rank, " registered shape ",
                     planner::IndexToString(have.shape), " ", planner::DTypeName(have.dtype), ", rank ", rank,
                     " registered ", planner::IndexToString(side->shape), " ", planner::DTypeName(side->dtype)));
  }
  if (have.scales.empty() != side->scales.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", side->name, "': rank ", (have.scales.empty() ? rank : it->second.first_rank),
        " registered it with block scales, rank ", (have.scales.empty() ? it->second.first_rank : rank), " without"));
  }
  have.layout.placements.insert(have.layout.placements.end(), side->layout.placements.begin(),
                                side->layout.placements.end());
  have.layout.fills.insert(have.layout.fills.end(), side->layout.fills.begin(), side->layout.fills.end());
  have.scales.insert(have.scales.end(), side->scales.begin(), side->scales.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<planner::PlanInput> CollectPlanInput(const std::map<int32_t, v1::PublishRequest>& published,
                                                    spec::BufferIds& ids, const std::vector<int32_t>& target_ranks) {
  planner::PlanInput input;
  std::map<std::string, Gathered> sources, targets;
  const auto writes_targets_of = [&](int32_t rank) {
    return target_ranks.empty() || std::find(target_ranks.begin(), target_ranks.end(), rank) != target_ranks.end();
  };
  for (const auto& [rank, publication] : published) {
    for (const v1::PublishedLayout& layout : publication.layouts()) {
      for (const v1::BufferInfo& b : layout.buffers()) {
        input.buffers.push_back(planner::Buffer{planner::Holder{rank, ids.Id(b.name())}, b.bytes(),
                                                absl::StrCat(layout.client_id(), "/", b.name())});
      }
      // A target is held where it was published: a partial sync leaves out the others.
      if (layout.role() == v1::TARGET && !writes_targets_of(rank)) continue;
      for (const v1::TensorLayout& t : layout.tensors()) {
        SHARDSYNC_RETURN_IF_ERROR(Merge(layout.role() == v1::SOURCE ? sources : targets, t, rank, ids));
      }
    }
  }
  std::vector<planner::TensorSide> source_sides, target_sides;
  for (auto& [name, g] : sources) source_sides.push_back(std::move(g.side));
  for (auto& [name, g] : targets) target_sides.push_back(std::move(g.side));
  SHARDSYNC_ASSIGN_OR_RETURN(input.tensors, planner::MatchTensors(source_sides, target_sides));
  return input;
}

absl::Status CheckSourceOwners(const std::map<int32_t, v1::PublishRequest>& published,
                               const std::vector<uint32_t>& shared_uids) {
  struct Owner {
    uint32_t uid;
    int32_t rank;
    std::string client;
  };
  const auto shared = [&](uint32_t uid) {
    return std::find(shared_uids.begin(), shared_uids.end(), uid) != shared_uids.end();
  };
  std::map<std::string, Owner> owners;  // by tensor: the first source's
  for (const auto& [rank, publication] : published) {
    for (const v1::PublishedLayout& layout : publication.layouts()) {
      if (layout.role() != v1::SOURCE) continue;
      for (const v1::TensorLayout& t : layout.tensors()) {
        const auto [it, first] = owners.emplace(t.name(), Owner{layout.uid(), rank, layout.client_id()});
        const Owner& owner = it->second;
        if (first || owner.uid == layout.uid() || (shared(owner.uid) && shared(layout.uid()))) continue;
        return absl::PermissionDeniedError(absl::StrCat(
            "tensor '", t.name(), "' has sources from uid ", owner.uid, " (client '", owner.client, "' on rank ",
            owner.rank, ") and from uid ", layout.uid(), " (client '", layout.client_id(), "' on rank ", rank,
            "); one user writes a tensor's sources unless --shared-source-uids names both"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> TargetRanks(const std::map<int32_t, v1::PublishRequest>& published) {
  std::vector<int32_t> ranks;
  for (const auto& [rank, publication] : published) {
    for (const v1::PublishedLayout& layout : publication.layouts()) {
      if (layout.role() == v1::TARGET && layout.tensors_size() > 0) {
        ranks.push_back(rank);
        break;
      }
    }
  }
  return ranks;
}

std::string MissingSourceHint(const std::map<int32_t, v1::PublishRequest>& published, const std::string& tensor) {
  std::vector<int32_t> holding, lacking;
  for (const auto& [rank, publication] : published) {
    bool has_tensor = false;
    for (const v1::PublishedLayout& layout : publication.layouts()) {
      if (layout.role() != v1::SOURCE) continue;
      for (const v1::TensorLayout& t : layout.tensors()) has_tensor = has_tensor || t.name() == tensor;
    }
    (has_tensor ? holding : lacking).push_back(rank);
  }
  const auto ranks = [](const std::vector<int32_t>& r) {
    return r.empty() ? "none" : "rank " + absl::StrJoin(r, ", rank ");
  };
  return absl::StrCat(" (sources of '", tensor, "' published by ", ranks(holding), "; by none of ", ranks(lacking),
                      ")");
}

}  // namespace shardsync::coordinator

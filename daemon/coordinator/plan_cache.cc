#include "daemon/coordinator/plan_cache.h"

#include <malloc.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "daemon/coordinator/layouts.h"
#include "spdlog/spdlog.h"

namespace shardsync::coordinator {

absl::StatusOr<const CachedPlan*> PlanCache::Get(const std::vector<int32_t>& target_ranks, bool* planned) {
  *planned = false;
  const int64_t epoch_now = directory_.epoch();
  const std::vector<int32_t> nodes = directory_.NodeOfRank();
  // A new epoch, or an agent that came back on another node: plan again.
  if (!plans_.empty() && (plans_.begin()->second.epoch != epoch_now ||
                          plans_.begin()->second.compiled.planned.plan.node_of_rank != nodes)) {
    plans_.clear();
  }
  if (auto cached = plans_.find(target_ranks); cached != plans_.end()) return &cached->second;
  const absl::Time start = absl::Now();
  int64_t epoch = 0;
  const std::map<int32_t, v1::PublishRequest> published = directory_.Published(&epoch);
  SHARDSYNC_ASSIGN_OR_RETURN(EpochPlan compiled, PlanEpoch(published, nodes, target_ranks, options_));
  CachedPlan cache;
  cache.epoch = epoch;
  cache.target_ranks = target_ranks.empty() ? TargetRanks(published) : target_ranks;
  cache.partial = !target_ranks.empty();
  cache.compiled = std::move(compiled);
  cache.plan_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const planner::StreamedPlan& made = cache.compiled.planned;
  const std::pair<double, double>& floors = made.floors;
  spdlog::info(
      "planned epoch {}{}: {} tensors, {} segments ({} MiB kept in {}), {} stage(s), digest {} in {:.2f} ms{}", epoch,
      target_ranks.empty() ? "" : absl::StrCat(" for the targets of rank ", absl::StrJoin(target_ranks, ", rank ")),
      made.plan.tensor_names.size(), made.stats.segments, cache.compiled.segments->file_bytes() >> 20,
      options_.plan_dir, made.plan.stages, made.digest, cache.plan_seconds * 1e3,
      floors.first > 0
          ? absl::StrFormat(" (floor %.3f ms unrelayed, %.3f ms relayed)", floors.first * 1e3, floors.second * 1e3)
          : "");
  // Keep the full plan and this one.
  for (auto it = plans_.begin(); it != plans_.end();) it = it->first.empty() ? std::next(it) : plans_.erase(it);
  *planned = true;
  return &(plans_[target_ranks] = std::move(cache));
}

bool PlanCache::ReleaseStale() {
  if (plans_.empty() || plans_.begin()->second.epoch == directory_.epoch()) return false;
  plans_.clear();
  malloc_trim(0);  // give the freed plans back to the system, not only to malloc
  return true;
}

}  // namespace shardsync::coordinator

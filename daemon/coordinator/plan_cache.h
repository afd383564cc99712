// The plans of the current layout epoch, by target selection: the full plan and the
// last partial one (a refill is rare, and a plan can be large). Not thread-safe: the
// SyncRunner uses it under its sync lock. A pointer it returns lives until the next
// Get or ReleaseStale.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/coordinator/agent_directory.h"
#include "daemon/coordinator/epoch_plan.h"

namespace shardsync::coordinator {

// The plan of one layout epoch and target selection.
struct CachedPlan {
  int64_t epoch = -1;
  std::vector<int32_t> target_ranks;  // whose targets it writes, ascending
  bool partial = false;               // only those asked for, not every target
  EpochPlan compiled;
  double plan_seconds = 0;
};

class PlanCache {
 public:
  PlanCache(const AgentDirectory& directory, const EpochOptions& options) : directory_(directory), options_(options) {}

  // The plan of the current epoch that writes the targets of `target_ranks` (empty:
  // every target), planned now unless cached (`*planned` says which).
  absl::StatusOr<const CachedPlan*> Get(const std::vector<int32_t>& target_ranks, bool* planned);
  // Frees the plans of an older layout epoch and gives their memory back to the
  // system; true if it freed any.
  bool ReleaseStale();

 private:
  const AgentDirectory& directory_;
  const EpochOptions& options_;
  std::map<std::vector<int32_t>, CachedPlan> plans_;  // by target selection (empty: every target)
};

}  // namespace shardsync::coordinator

#include "planner/relay.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardsync::planner {

absl::StatusOr<RelayMode> ParseRelayMode(absl::string_view name) {
  if (name == "never") return RelayMode::kNever;
  if (name == "always") return RelayMode::kAlways;
  if (name == "auto") return RelayMode::kAuto;
  return absl::InvalidArgumentError(absl::StrCat("the relay mode is auto, always or never, not '", name, "'"));
}

absl::StatusOr<Plan> MakePlanWithRelay(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                       const Bandwidths& bandwidths, std::pair<double, double>* floors,
                                       int64_t scratch_bytes) {
  if (mode != RelayMode::kAuto) return MakePlan(input, policy, PlanOptions{mode == RelayMode::kAlways, scratch_bytes});
  // With nothing to relay the relayed plan is the direct one: plan a second time only
  // when the relay changed something.
  absl::StatusOr<Plan> relayed = MakePlan(input, policy, PlanOptions{true, scratch_bytes});
  if (!relayed.ok()) return relayed;
  if (std::none_of(relayed->segments.begin(), relayed->segments.end(),
                   [](const Segment& s) { return IsRelayStage(s.stage); })) {
    return relayed;
  }
  SHARDSYNC_ASSIGN_OR_RETURN(Plan unrelayed, MakePlan(input, policy, PlanOptions{false, scratch_bytes}));
  const double unrelayed_floor = CostFloorSeconds(StageBytes(unrelayed), bandwidths);
  const double relayed_floor = CostFloorSeconds(StageBytes(*relayed), bandwidths);
  if (floors != nullptr) *floors = {unrelayed_floor, relayed_floor};
  if (relayed_floor < unrelayed_floor) return relayed;  // moved, as the line below
  return unrelayed;
}

}  // namespace shardsync::planner

// Planning with or without the relay across nodes, chosen by the cost floor.
#pragma once

#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/cost.h"
#include "planner/plan.h"

namespace shardsync::planner {

// Whether a plan over several nodes relays (PlanOptions::relay): never, always, or when
// its floor is lower (auto).
enum class RelayMode { kNever, kAlways, kAuto };
// "never", "always", "auto".
absl::StatusOr<RelayMode> ParseRelayMode(absl::string_view name);

// Plans the batch as `mode` says. kAuto plans with the relay and, if that relays
// anything, without it too, and keeps the plan whose floor at `bandwidths` is lower
// (without the relay on a tie: one stage fewer); `floors`, if given, gets both (without,
// with) when both were planned, and stays as it was otherwise. `scratch_bytes`: as
// PlanOptions::scratch_bytes.
absl::StatusOr<Plan> MakePlanWithRelay(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                       const Bandwidths& bandwidths, std::pair<double, double>* floors = nullptr,
                                       int64_t scratch_bytes = kDefaultScratchBytes);

}  // namespace shardsync::planner

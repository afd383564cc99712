// Planning with or without the relay across nodes, chosen by the cost floor.
#pragma once

#include <string>
#include <utility>
#include <vector>

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

// Whether to plan the batch with the relay, as `mode` says. kAuto counts a plan with the
// relay and, if that relays anything, one without it too (StreamPlan, no segment kept),
// and relays if its floor at `bandwidths` is lower (not on a tie: one stage fewer);
// `floors`, if given, gets both (without, with) when both were counted, and stays as it
// was otherwise. `scratch_bytes`: as PlanOptions::scratch_bytes.
absl::StatusOr<bool> ChooseRelay(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                 const Bandwidths& bandwidths, std::pair<double, double>* floors = nullptr,
                                 int64_t scratch_bytes = kDefaultScratchBytes);

// MakePlan with the relay as ChooseRelay chooses.
absl::StatusOr<Plan> MakePlanWithRelay(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                       const Bandwidths& bandwidths, std::pair<double, double>* floors = nullptr,
                                       int64_t scratch_bytes = kDefaultScratchBytes);

// A plan as MakePlanWithRelay makes it, without holding it: what a coordinator needs to
// deliver each rank's schedule later from that rank's segments alone.
struct StreamedPlan {
  Plan plan;                               // every field but its segments; num_ranks as asked
  PlanStats stats;                         // ComputeStats of it and its MakeSchedules at the staging budget
  std::vector<int32_t> first_rounds;       // by stage: Stage::first_round on every rank
  std::string digest;                      // PlanDigest at the staging budget
  std::pair<double, double> floors{0, 0};  // as ChooseRelay gives them
};

// Plans as MakePlanWithRelay, every segment given to `sink` in plan order (after the
// counting passes ChooseRelay makes) and none kept. `num_ranks`: the plan's, at least
// one past the highest rank of the input. Refuses what MakeSchedules would refuse at
// `staging_bytes`, before or while segments go to `sink`.
absl::StatusOr<StreamedPlan> PlanStreamed(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                          const Bandwidths& bandwidths, int64_t scratch_bytes, int64_t staging_bytes,
                                          int32_t num_ranks, const SegmentSink& sink);

}  // namespace shardsync::planner

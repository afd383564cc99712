#include "planner/relay.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/digest.h"

namespace shardsync::planner {

absl::StatusOr<RelayMode> ParseRelayMode(absl::string_view name) {
  if (name == "never") return RelayMode::kNever;
  if (name == "always") return RelayMode::kAlways;
  if (name == "auto") return RelayMode::kAuto;
  return absl::InvalidArgumentError(absl::StrCat("the relay mode is auto, always or never, not '", name, "'"));
}

namespace {

// The floor of a plan at `bandwidths`, counted by StreamPlan; whether it relays anything.
absl::StatusOr<std::pair<double, bool>> CountFloor(const PlanInput& input, const ReplicaPolicy& policy,
                                                   const PlanOptions& options, const Bandwidths& bandwidths) {
  StreamedStageBytes bytes(input);
  bool relays = false;
  SHARDSYNC_ASSIGN_OR_RETURN(const Plan plan, StreamPlan(input, policy, options, [&](absl::Span<const Segment> tensor) {
                               bytes.Add(tensor);
                               relays = relays || std::any_of(tensor.begin(), tensor.end(),
                                                              [](const Segment& s) { return IsRelayStage(s.stage); });
                               return absl::OkStatus();
                             }));
  return std::make_pair(CostFloorSeconds(bytes.Finish(plan), bandwidths), relays);
}

}  // namespace

absl::StatusOr<bool> ChooseRelay(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                 const Bandwidths& bandwidths, std::pair<double, double>* floors,
                                 int64_t scratch_bytes) {
  if (mode != RelayMode::kAuto) return mode == RelayMode::kAlways;
  // With nothing to relay the relayed plan is the direct one: count a second time only
  // when the relay changed something.
  SHARDSYNC_ASSIGN_OR_RETURN(const auto relayed,
                             CountFloor(input, policy, PlanOptions{true, scratch_bytes}, bandwidths));
  if (!relayed.second) return true;
  SHARDSYNC_ASSIGN_OR_RETURN(const auto unrelayed,
                             CountFloor(input, policy, PlanOptions{false, scratch_bytes}, bandwidths));
  if (floors != nullptr) *floors = {unrelayed.first, relayed.first};
  return relayed.first < unrelayed.first;
}

absl::StatusOr<Plan> MakePlanWithRelay(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                       const Bandwidths& bandwidths, std::pair<double, double>* floors,
                                       int64_t scratch_bytes) {
  SHARDSYNC_ASSIGN_OR_RETURN(const bool relay, ChooseRelay(input, policy, mode, bandwidths, floors, scratch_bytes));
  return MakePlan(input, policy, PlanOptions{relay, scratch_bytes});
}

absl::StatusOr<StreamedPlan> PlanStreamed(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                          const Bandwidths& bandwidths, int64_t scratch_bytes, int64_t staging_bytes,
                                          int32_t num_ranks, const SegmentSink& sink) {
  if (staging_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("staging budget must be positive, got ", staging_bytes));
  }
  StreamedPlan streamed;
  SHARDSYNC_ASSIGN_OR_RETURN(const bool relay,
                             ChooseRelay(input, policy, mode, bandwidths, &streamed.floors, scratch_bytes));
  StreamedStats stats(input, staging_bytes, num_ranks);
  PlanDigester digester;
  SHARDSYNC_ASSIGN_OR_RETURN(streamed.plan, StreamPlan(input, policy, PlanOptions{relay, scratch_bytes},
                                                       [&](absl::Span<const Segment> tensor) -> absl::Status {
                                                         SHARDSYNC_RETURN_IF_ERROR(stats.Add(tensor));
                                                         digester.Add(tensor);
                                                         return sink(tensor);
                                                       }));
  streamed.plan.num_ranks = std::max(streamed.plan.num_ranks, num_ranks);
  streamed.stats = stats.Finish(streamed.plan, &streamed.first_rounds);
  streamed.digest = digester.Finish(streamed.plan, staging_bytes);
  return streamed;
}

}  // namespace shardsync::planner

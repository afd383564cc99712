#include "daemon/coordinator/epoch_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "daemon/common/schedule_codec.h"
#include "daemon/coordinator/layouts.h"
#include "planner/digest.h"

namespace shardsync::coordinator {
namespace {

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

}  // namespace

absl::StatusOr<EpochPlan> PlanEpoch(const std::map<int32_t, v1::PublishRequest>& published,
                                    const std::vector<int32_t>& node_of_rank, const std::vector<int32_t>& target_ranks,
                                    const EpochOptions& options) {
  SHARDSYNC_RETURN_IF_ERROR(CheckSourceOwners(published, options.shared_source_uids));
  spec::BufferIds ids;
  SHARDSYNC_ASSIGN_OR_RETURN(planner::PlanInput input, CollectPlanInput(published, ids, target_ranks));
  if (input.tensors.empty()) return absl::FailedPreconditionError("no target tensor is registered: nothing to sync");
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.rank >= options.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", b.holder.rank, " is outside a world of ", options.world_size));
    }
  }
  input.node_of_rank = node_of_rank;
  absl::StatusOr<EpochPlan> epoch = CompileEpoch(input, ids.names(), options);
  if (!epoch.ok()) {
    if (auto tensor = epoch.status().GetPayload(planner::kUncoveredTensorPayload)) {
      return absl::Status(epoch.status().code(),
                          absl::StrCat(epoch.status().message(), MissingSourceHint(published, std::string(*tensor))));
    }
  }
  return epoch;
}

absl::StatusOr<EpochPlan> CompileEpoch(const planner::PlanInput& input, const std::vector<std::string>& buffer_names,
                                       const EpochOptions& options) {
  EpochPlan epoch;
  absl::Time start = absl::Now();
  SHARDSYNC_ASSIGN_OR_RETURN(epoch.plan,
                             planner::MakePlanWithRelay(input, *planner::LocalFirstLeastLoaded(), options.relay,
                                                        options.bandwidths, &epoch.floors, options.scratch_bytes));
  epoch.plan.num_ranks = options.world_size;
  epoch.timings.plan_seconds = SecondsSince(start);

  start = absl::Now();
  SHARDSYNC_ASSIGN_OR_RETURN(epoch.schedules, planner::MakeSchedules(epoch.plan, options.staging_bytes));
  epoch.timings.schedule_seconds = SecondsSince(start);

  start = absl::Now();
  epoch.digest = planner::PlanDigest(epoch.plan, options.staging_bytes);
  epoch.timings.digest_seconds = SecondsSince(start);

  start = absl::Now();
  const std::vector<v1::PrepareRequest*> requests =
      daemon::EncodeSchedules(epoch.plan, epoch.schedules, buffer_names, *epoch.arena);
  epoch.requests.assign(requests.begin(), requests.end());
  epoch.timings.encode_seconds = SecondsSince(start);

  for (const auto& stage : planner::StageBytes(epoch.plan)) {
    for (const planner::RankStats& r : stage) {
      epoch.network_bytes += r.network_sent_bytes;
      epoch.relayed_bytes += r.relayed_bytes;
    }
  }
  return epoch;
}

}  // namespace shardsync::coordinator

#include "daemon/coordinator/epoch_plan.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/common/schedule_codec.h"
#include "daemon/coordinator/layouts.h"
#include "planner/schedule.h"

namespace shardsync::coordinator {
std::string DefaultPlanDir() {
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/var/tmp";
}

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
  SHARDSYNC_ASSIGN_OR_RETURN(epoch.segments, SegmentSpill::Create(options.plan_dir, options.world_size));
  SHARDSYNC_ASSIGN_OR_RETURN(
      epoch.planned,
      planner::PlanStreamed(input, *planner::LocalFirstLeastLoaded(), options.relay, options.bandwidths,
                            options.scratch_bytes, options.staging_bytes, options.world_size,
                            [&](absl::Span<const planner::Segment> tensor) { return epoch.segments->Add(tensor); }));
  SHARDSYNC_RETURN_IF_ERROR(epoch.segments->Finish());
  epoch.buffer_names = buffer_names;
  epoch.staging_bytes = options.staging_bytes;
  return epoch;
}

absl::StatusOr<v1::PrepareRequest> ScheduleRequest(const EpochPlan& epoch, int32_t rank) {
  // The plan's shared fields are read where they are, not copied for each rank.
  SHARDSYNC_ASSIGN_OR_RETURN(const planner::BlockVector<planner::Segment> segments, epoch.segments->Read(rank));
  SHARDSYNC_ASSIGN_OR_RETURN(
      const planner::Schedule schedule,
      planner::MakeRankSchedule(epoch.planned.plan, segments, rank, epoch.staging_bytes, epoch.planned.first_rounds));
  return daemon::EncodeRankSchedule(epoch.planned.plan, segments, schedule, epoch.buffer_names);
}

}  // namespace shardsync::coordinator

// The coordinator's work once per layout epoch, as one function: what the agents
// published -> the plan, streamed (planner::PlanStreamed: its counts, digest and rounds,
// no segment held), with each rank's segments kept in a file (SegmentSpill); and, when a
// rank needs it, that rank's schedule as its PrepareRequest. The coordinator, its tests
// and its benchmark call them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/coordinator/segment_spill.h"
#include "planner/cost.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

// Where the plan's file goes unless told: $TMPDIR, else /var/tmp (on disk, unlike a
// tmpfs /tmp, so a large plan does not take memory).
std::string DefaultPlanDir();

struct EpochOptions {
  int32_t world_size = 1;  // every rank gets a schedule, empty or not
  planner::RelayMode relay = planner::RelayMode::kAuto;
  planner::Bandwidths bandwidths;                         // the relay choice (kAuto)
  int64_t staging_bytes = 0;                              // per peer, both directions
  int64_t scratch_bytes = planner::kDefaultScratchBytes;  // per rank, for block-quantized targets
  std::vector<uint32_t> shared_source_uids;               // may be sources of one tensor together
  std::string plan_dir = DefaultPlanDir();                // where SegmentSpill's file is made
};

struct EpochPlan {
  planner::StreamedPlan planned;           // plan without segments, stats, rounds, digest, floors
  std::vector<std::string> buffer_names;   // by buffer id, as the agents registered them
  std::unique_ptr<SegmentSpill> segments;  // each rank's
  int64_t staging_bytes = 0;
  const std::string& digest() const { return planned.digest; }
};

// Plans what `published` holds: every target, or with `target_ranks` only the targets
// those ranks published. `node_of_rank` (one entry per rank; empty: one node) decides
// what crosses the network. Refuses sources of one tensor from several uids (unless
// shared), a rank outside the world, and no target at all (FAILED_PRECONDITION); a
// target element without a source names the ranks that hold sources of its tensor.
absl::StatusOr<EpochPlan> PlanEpoch(const std::map<int32_t, v1::PublishRequest>& published,
                                    const std::vector<int32_t>& node_of_rank, const std::vector<int32_t>& target_ranks,
                                    const EpochOptions& options);

// The step after collecting. `buffer_names`: by buffer id, as the agents registered them.
absl::StatusOr<EpochPlan> CompileEpoch(const planner::PlanInput& input, const std::vector<std::string>& buffer_names,
                                       const EpochOptions& options);

// `rank`'s schedule as its PrepareRequest (schedule only), made now from its segments
// alone: what EncodeSchedule gives for the whole plan's schedule of that rank. Safe to
// call for several ranks at once; holds one rank's segments while it runs.
absl::StatusOr<v1::PrepareRequest> ScheduleRequest(const EpochPlan& epoch, int32_t rank);

}  // namespace shardsync::coordinator

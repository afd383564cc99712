// The coordinator's work once per layout epoch, as one pure function: what the agents
// published -> the plan, every rank's schedule, the digest and every rank's encoded
// PrepareRequest (schedule only). The coordinator, its tests and its benchmark call it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/arena.h"
#include "planner/cost.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "planner/schedule.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

struct EpochOptions {
  int32_t world_size = 1;  // every rank gets a schedule, empty or not
  planner::RelayMode relay = planner::RelayMode::kAuto;
  planner::Bandwidths bandwidths;                         // the relay choice (kAuto)
  int64_t staging_bytes = 0;                              // per peer, both directions
  int64_t scratch_bytes = planner::kDefaultScratchBytes;  // per rank, for block-quantized targets
  std::vector<uint32_t> shared_source_uids;               // may be sources of one tensor together
};

// Wall time of each step, for logs and the benchmark.
struct EpochTimings {
  double plan_seconds = 0, schedule_seconds = 0, digest_seconds = 0, encode_seconds = 0;
  double total() const { return plan_seconds + schedule_seconds + digest_seconds + encode_seconds; }
};

struct EpochPlan {
  planner::Plan plan;
  std::vector<planner::Schedule> schedules;  // by rank
  std::string digest;                        // of the plan and the staging budget
  std::pair<double, double> floors{0, 0};    // without and with the relay, when kAuto planned both
  int64_t network_bytes = 0;                 // between nodes
  int64_t relayed_bytes = 0;                 // forwarded from targets in relay stages
  // By rank, schedule only, owned by `arena` (one allocation pool for millions of
  // segment specs, freed at once with the plan).
  std::unique_ptr<google::protobuf::Arena> arena = std::make_unique<google::protobuf::Arena>();
  std::vector<const v1::PrepareRequest*> requests;
  EpochTimings timings;
};

// Plans what `published` holds: every target, or with `target_ranks` only the targets
// those ranks published. `node_of_rank` (one entry per rank; empty: one node) decides
// what crosses the network. Refuses sources of one tensor from several uids (unless
// shared), a rank outside the world, and no target at all (FAILED_PRECONDITION); a
// target element without a source names the ranks that hold sources of its tensor.
absl::StatusOr<EpochPlan> PlanEpoch(const std::map<int32_t, v1::PublishRequest>& published,
                                    const std::vector<int32_t>& node_of_rank, const std::vector<int32_t>& target_ranks,
                                    const EpochOptions& options);

// The steps after collecting: plan, schedules, digest, requests. `buffer_names`: by
// buffer id, as the agents registered them.
absl::StatusOr<EpochPlan> CompileEpoch(const planner::PlanInput& input, const std::vector<std::string>& buffer_names,
                                       const EpochOptions& options);

}  // namespace shardsync::coordinator

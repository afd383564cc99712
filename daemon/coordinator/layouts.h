// Everything the agents published, as one planner input: sides of a tensor from many
// ranks and clients merged by name (shape and dtype must agree), buffers named by
// (rank, name). Translation only; the planner does the checking that matters.
#pragma once

#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "proto/shardsync.pb.h"
#include "spec/layout_spec.h"

namespace shardsync::coordinator {

// With `target_ranks` (a partial sync), only the targets those ranks published; every
// target when empty.
absl::StatusOr<planner::PlanInput> CollectPlanInput(const std::map<int32_t, v1::PublishRequest>& published,
                                                    spec::BufferIds& ids,
                                                    const std::vector<int32_t>& target_ranks = {});

// One user writes a tensor's sources: refuses (PERMISSION_DENIED, naming both) a tensor
// whose sources were registered by processes of different uids, unless both uids are
// in `shared_uids` (replicas the operator allowed from several users).
absl::Status CheckSourceOwners(const std::map<int32_t, v1::PublishRequest>& published,
                               const std::vector<uint32_t>& shared_uids);

// The ranks that published a target tensor, ascending.
std::vector<int32_t> TargetRanks(const std::map<int32_t, v1::PublishRequest>& published);

// For a tensor some target element of which has no source: which publishing ranks
// hold sources of it and which hold none, as " (sources of 'w' published by rank 0,
// rank 1; by none of rank 2)".
std::string MissingSourceHint(const std::map<int32_t, v1::PublishRequest>& published, const std::string& tensor);

}  // namespace shardsync::coordinator

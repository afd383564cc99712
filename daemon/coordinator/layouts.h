// Everything the agents published, as one planner input: sides of a tensor from many
// ranks and clients merged by name (shape and dtype must agree), buffers named by
// (rank, name). Translation only; the planner does the checking that matters.
#pragma once

#include <map>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "proto/shardsync.pb.h"
#include "spec/layout_spec.h"

namespace shardsync::coordinator {

absl::StatusOr<planner::PlanInput> CollectPlanInput(const std::map<int32_t, v1::PublishRequest>& published,
                                                    spec::BufferIds& ids);

// For a tensor some target element of which has no source: the ranks that publish
// sources of other tensors but none of this one, as " (ranks publishing sources but
// none of 'w': rank 2)"; empty when there are none.
std::string MissingSourceHint(const std::map<int32_t, v1::PublishRequest>& published, const std::string& tensor);

}  // namespace shardsync::coordinator

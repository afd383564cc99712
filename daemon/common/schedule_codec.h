// One rank's schedule on the wire (PrepareRequest) and back. The coordinator encodes
// only what the rank touches, renumbered; the agent decodes it into a local plan and
// schedule for the executor, refusing any malformed message.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/arena.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "proto/shardsync.pb.h"

namespace shardsync::daemon {

// `buffer_names[id]` names planner buffer id `id`.
v1::PrepareRequest EncodeSchedule(const planner::Plan& plan, const planner::Schedule& schedule,
                                  const std::vector<std::string>& buffer_names);
// The same, made on `arena`, which owns it: a plan of millions of segments encodes
// without a heap allocation per field.
v1::PrepareRequest* EncodeSchedule(const planner::Plan& plan, const planner::Schedule& schedule,
                                   const std::vector<std::string>& buffer_names, google::protobuf::Arena& arena);

struct LocalSchedule {
  planner::Plan plan;
  planner::Schedule schedule;
  std::vector<std::string> buffer_names;  // by the local plan's Holder::buffer id
};

absl::StatusOr<LocalSchedule> DecodeSchedule(const v1::PrepareRequest& request, int32_t rank);

}  // namespace shardsync::daemon

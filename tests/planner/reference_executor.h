// A host reference executor for tests: applies schedules to byte buffers in memory,
// exactly as an agent would (local copies, fills, then rounds of packed chunks through
// bounded staging), and checks that both ends of every chunk agree.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::testing {

struct ExecutionStats {
  int64_t peak_staging_bytes = 0;  // largest chunk packed for one peer
  int64_t sent_bytes = 0;
  int64_t local_bytes = 0;
  int32_t rounds = 0;
};

using HostBuffers = std::map<planner::Holder, std::vector<uint8_t>>;

// Buffers of the sizes `input` declares, zeroed.
HostBuffers AllocateBuffers(const planner::PlanInput& input);

absl::StatusOr<ExecutionStats> Execute(const planner::Plan& plan, const std::vector<planner::Schedule>& schedules,
                                       int64_t staging_bytes, HostBuffers& buffers);

// float32 -> bfloat16, round to nearest even (NaN stays NaN): what a sender does.
uint16_t Float32ToBFloat16(uint32_t bits);

}  // namespace shardsync::testing

// `sync --verify`: after a sync, what this rank read from its sources and what its
// targets hold now, as checksums the coordinator adds up over ranks and compares.
// Each segment's elements, in its row-major order and in the target dtype, hash to one
// value (executor/word_hash.h, computed where the bytes live), mixed with the segment's
// place in its stream (sender, receiver, position: the same on both ends); the sums per
// (tensor, target rank) of the source side must equal those of the target side. Fills
// count on the target's rank: zeros expected, the bytes found.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "executor/device.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::executor {

struct SideSums {
  uint64_t sources = 0;  // wrapping sums
  uint64_t targets = 0;
};
// By (tensor name, target rank).
using Checksums = std::map<std::pair<std::string, int32_t>, SideSums>;

// Packs through `device` into one staging buffer of `staging_bytes` (at least 1 MiB
// is used, freed at the end) and hashes it there.
absl::StatusOr<Checksums> ComputeChecksums(Device& device, const planner::Plan& plan, const planner::Schedule& schedule,
                                           const BufferTable& buffers, int64_t staging_bytes);

}  // namespace shardsync::executor

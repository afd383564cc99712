// `sync --verify`: after a sync, what this rank read from its sources and what its
// targets hold now, as checksums the coordinator adds up over ranks and compares.
// Each segment's elements, in its row-major order and in the target dtype, hash to one
// value, mixed with the segment's place in its stream (sender, receiver, position: the
// same on both ends); the sums per (tensor, target rank) of the source side must equal
// those of the target side. Fills count on the target's rank: zeros expected, the bytes
// found.
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

// Reads through `device` in pieces of at most `scratch_bytes` (one staging buffer).
absl::StatusOr<Checksums> ComputeChecksums(Device& device, const planner::Plan& plan,
                                           const planner::Schedule& schedule, const BufferTable& buffers,
                                           int64_t scratch_bytes);

// Streams bytes into one 64-bit hash; the result depends only on the bytes, not on how
// they were split into calls.
class StreamHash {
 public:
  void Update(const uint8_t* data, int64_t bytes);
  uint64_t Final() const;

 private:
  void Mix(uint64_t word);
  uint64_t state_ = 0x9e3779b97f4a7c15ULL;
  uint64_t pending_ = 0;  // bytes of a word not yet full
  int pending_bytes_ = 0;
  int64_t length_ = 0;
};

}  // namespace shardsync::executor

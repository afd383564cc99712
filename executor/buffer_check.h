// Before a rank moves a byte: every region its part of a plan reads or writes lies
// inside the buffer that holds it, so a bad schedule is a refusal, never a stray write.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "planner/plan.h"

namespace shardsync::executor {

// Segments, fills and quantizes (scratch, float8 target and scales). `buffer_bytes[id]`:
// the size of buffer `id` on `rank` (ids as the plan's holders
// name them on this rank); `buffer_names[id]` names it in a refusal, with the tensor.
absl::Status CheckRegionsFit(const planner::Plan& plan, int32_t rank, absl::Span<const int64_t> buffer_bytes,
                             absl::Span<const std::string> buffer_names);

// The direct path: every segment `rank` sends to one of `direct_peers` (ascending)
// writes inside the peer's buffer as mapped on `rank` (`buffer_bytes` and
// `buffer_names` by the same ids as the plan's dst holders).
absl::Status CheckDirectWritesFit(const planner::Plan& plan, int32_t rank, absl::Span<const int32_t> direct_peers,
                                  absl::Span<const int64_t> buffer_bytes, absl::Span<const std::string> buffer_names);

}  // namespace shardsync::executor

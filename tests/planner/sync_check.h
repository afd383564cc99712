// Test helpers: random tensor values written into every source placement, poisoned
// targets, and an element-by-element check of a finished sync.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "planner/types.h"
#include "tests/planner/reference_executor.h"

namespace shardsync::testing {

// Random logical values of every tensor (row-major, source dtype), never all zero.
using TensorValues = std::vector<std::vector<uint8_t>>;

// Fills every buffer with random poison, then writes `values` into every source
// placement. Returns the values.
TensorValues PrepareBuffers(const planner::PlanInput& input, std::mt19937_64& rng, HostBuffers& buffers);
// Writes `values` into every source placement (a trainer's step), nothing else.
void WriteSources(const planner::PlanInput& input, const TensorValues& values, HostBuffers& buffers);

// Every target element equals its source (converted to the target dtype), every fill
// is zero, and no other byte of any buffer differs from `before`. Returns the first
// few mismatches, described; empty when the sync is exact.
std::vector<std::string> CheckSync(const planner::PlanInput& input, const TensorValues& values,
                                   const HostBuffers& before, const HostBuffers& after);

}  // namespace shardsync::testing

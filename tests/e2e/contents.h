// Deterministic buffer contents for end-to-end tests, shared by the client helper
// processes (which write sources and poison targets) and the tests (which predict
// every target byte after a sync).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "planner/types.h"

namespace shardsync::e2e {

using Contents = std::map<planner::Holder, std::vector<uint8_t>>;

// Every source buffer: poison, then each tensor's values (from `seed`, never zero) at
// every source placement.
Contents SourceContents(const planner::PlanInput& input, uint64_t seed);
// Every target buffer as it must be after a sync of `seed`: the poison it started with
// (from `poison`), every target element equal to its source (converted to the target
// dtype), every fill zero.
Contents ExpectedTargets(const planner::PlanInput& input, uint64_t seed, uint64_t poison);
// A target buffer as its client creates it, before any sync.
std::vector<uint8_t> PoisonedBuffer(int64_t bytes, planner::Holder holder, uint64_t poison);

}  // namespace shardsync::e2e

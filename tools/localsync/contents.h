// Deterministic buffer contents for local runs and end-to-end tests, shared by the demo
// client processes (which write sources and poison targets) and the drivers (which
// predict every target byte after a sync). Values are computed element by element
// from (seed, tensor, index): nothing the size of a model is held in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "planner/types.h"

namespace shardsync::localsync {

using Contents = std::map<planner::Holder, std::vector<uint8_t>>;

// The source values of one step of a run: each element from `seed`; or, with `changed`
// below 1, a fixed `changed` fraction of each tensor's elements (the same ones at every
// step) from `seed` and the rest from `base`, the run's first seed: consecutive steps
// then differ in about that fraction (a trainer's step at a small learning rate).
struct SourceStep {
  uint64_t base = 1;
  uint64_t seed = 1;
  double changed = 1.0;
};

// Writes every source buffer of `rank` (found through `memory`, sized as `input` says):
// poison, then each tensor's values (from `seed`, no zero byte) at every source
// placement on the rank.
void WriteSources(const planner::PlanInput& input, const SourceStep& step, int32_t rank,
                  const std::function<uint8_t*(planner::Holder)>& memory);
// One target buffer as it must be after a sync of `seed`: the poison it started with
// (from `poison`), every target element equal to its source (converted to the target
// dtype), every fill zero; block-quantized targets and their scales as the receiver's
// quantizer makes them from the bfloat16 values (executor/block_quantize.h).
std::vector<uint8_t> ExpectedTarget(const planner::PlanInput& input, const SourceStep& step, uint64_t poison,
                                    planner::Holder holder);
// A buffer as its client creates it, before anything is written.
std::vector<uint8_t> PoisonedBuffer(int64_t bytes, planner::Holder holder, uint64_t poison);

}  // namespace shardsync::localsync

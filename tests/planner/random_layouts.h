// Seeded random layouts for property tests: whole models (ZeRO-1/2/3 sources, TP
// replicas with uneven, fused, padded and tied targets) and single tensors whose
// sources have different boundaries.
#pragma once

#include <random>

#include "planner/model_layout.h"
#include "planner/types.h"

namespace shardsync::testing {

planner::ModelLayoutSpec RandomModel(std::mt19937_64& rng);

// One tensor (1-3 axes) whose sources mix ZeRO-3 partitions, a surviving TP shard and
// ZeRO-partitioned TP shards, into TP targets and replicas built with Nest.
planner::PlanInput RandomMixedSources(std::mt19937_64& rng);

// Puts every rank of `input` on one of `nodes` nodes, at random (PlanInput::node_of_rank).
void PlaceOnRandomNodes(planner::PlanInput& input, int nodes, std::mt19937_64& rng);

}  // namespace shardsync::testing

// The identity of a plan: the same on every rank and every run for the same plan.
#pragma once

#include <cstdint>
#include <string>

#include "planner/plan.h"

namespace shardsync::planner {

// A 128-bit digest of the plan and its staging budget, as 32 hex digits: equal on every
// rank and every run for the same plan. Not cryptographic.
std::string PlanDigest(const Plan& plan, int64_t staging_bytes);

}  // namespace shardsync::planner

// Input checks that run before any planning: every error names tensor, rank and box.
#pragma once

#include "absl/status/status.h"
#include "planner/types.h"

namespace shardsync::planner {

// Buffers declared once with a non-negative size; tensors named once, at most kMaxAxes
// axes; boxes inside the tensor; placements and fills inside their buffers (no
// overflow); convertible dtypes; no two placements or fills (source or target) sharing
// a byte of a buffer.
absl::Status ValidatePlanInput(const PlanInput& input);

// A tensor's shape: at most kMaxAxes axes, none negative or past kMaxSegmentAxis, at
// most 2^62 elements (checked without overflow). Errors name `tensor`.
absl::Status ValidateShape(absl::string_view tensor, const Index& shape);

}  // namespace shardsync::planner

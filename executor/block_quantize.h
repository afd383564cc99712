// The block quantizer of planner/quantize.h on host memory: what a host device runs,
// and the rule the CUDA kernel (copy_kernels.h) matches bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "planner/quantize.h"

namespace shardsync::executor {

// FLOAT8_E4M3 (the "fn" variant: no infinities) nearest to `x`, ties to even,
// saturated to +-448; NaN gives NaN (0x7f with the sign).
uint8_t Float32ToFloat8E4M3(float x);

// A block's scale: amax / 448, or 1 for an all-zero block. amax is the largest finite
// magnitude: an infinity saturates to +-448 and NaN stays NaN, neither moves the scale.
float BlockScale(float amax);

// |x| where x counts toward a block's amax (finite), else 0.
inline float FiniteMagnitude(float x) { return std::isfinite(x) ? std::fabs(x) : 0.0f; }

// Quantizes `op` in host memory: `scratch`, `target` and `scale` are the starts of its
// three buffers.
void QuantizeHost(const planner::QuantizeOp& op, const uint8_t* scratch, uint8_t* target, uint8_t* scale);

}  // namespace shardsync::executor

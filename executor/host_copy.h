// Strided copies on host memory: pack a segment's elements into a staging buffer,
// unpack them into a target, copy locally, zero-fill. Elements [begin, end) count in
// the segment's row-major order; buffers are given by their start address.
// The sender converts dtype while packing (float32 -> bfloat16), so staging holds the
// target's bytes.
#pragma once

#include <cstdint>

#include "planner/plan.h"

namespace shardsync::executor {

void PackHost(const planner::Segment& s, int64_t begin, int64_t end, const uint8_t* src_buffer, uint8_t* out);
void UnpackHost(const planner::Segment& s, int64_t begin, int64_t end, const uint8_t* in, uint8_t* dst_buffer);
// The target side's elements [begin, end) packed as UnpackHost would read them: what a
// receiver holds of a chunk (the baseline of a delta).
void GatherHost(const planner::Segment& s, int64_t begin, int64_t end, const uint8_t* dst_buffer, uint8_t* out);
void CopyHost(const planner::Segment& s, const uint8_t* src_buffer, uint8_t* dst_buffer);
void FillHost(const planner::FillOp& fill, uint8_t* dst_buffer);

// Whether elements [begin, end) (row-major) sit back to back on one side, within a row
// or across rows, so that they can move or be hashed without staging. `source` picks
// the side.
bool IsContiguousRange(const planner::Segment& s, int64_t begin, int64_t end, bool source);

// float32 bits -> bfloat16 bits, round to nearest even; NaN stays NaN.
uint16_t Float32ToBFloat16(uint32_t bits);

}  // namespace shardsync::executor

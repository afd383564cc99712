// Batched strided copies on a CUDA device: many segments' pieces in one launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "executor/word_hash.h"

namespace shardsync::executor {

inline constexpr int kCopyAxes = 4;

// Copies elements [begin, begin + count) (row-major order of `shape`) of one piece.
// A side with `packed` set is a contiguous stream starting at its pointer; otherwise
// element i is at base + sum i_k * strides[k]. Offsets and strides are in elements of
// that side's size. `convert` turns float32 into bfloat16 (round to nearest even); a
// fill has no source and writes zeros.
struct CopyDescriptor {
  const uint8_t* src;
  uint8_t* dst;
  int64_t begin;
  int64_t count;
  int64_t shape[kCopyAxes];
  int64_t src_strides[kCopyAxes];
  int64_t dst_strides[kCopyAxes];
  int32_t axes;
  int32_t src_bytes;
  int32_t dst_bytes;
  uint8_t src_packed;
  uint8_t dst_packed;
  uint8_t convert;
  uint8_t fill;
};

// Elements each block copies; a descriptor gets ceil(count / kElementsPerBlock) blocks.
inline constexpr int64_t kElementsPerBlock = 32768;

// `descriptors` and `first_block` (the first block of each descriptor, `count` + 1
// entries, the last being the total) are in device memory.
cudaError_t LaunchCopies(const CopyDescriptor* descriptors, const int64_t* first_block, int32_t count,
                         int64_t total_blocks, cudaStream_t stream);

// One block-quantized target placement (planner/quantize.h): `rows` x `cols` bfloat16
// elements row-major at `scratch` into float8_e4m3 at `target` (row stride
// target_row_stride) and float32 scales at `scale` (row stride scale_row_stride).
struct QuantizeDescriptor {
  const uint8_t* scratch;
  uint8_t* target;
  uint8_t* scale;
  int64_t rows;
  int64_t cols;
  int64_t target_row_stride;
  int64_t scale_row_stride;
  int64_t first_block;  // of the launch's blocks, the first of this placement
};

// One thread block per 128 x 128 block of every placement, `total_blocks` in all;
// `descriptors` (by ascending first_block) are in device memory.
cudaError_t LaunchQuantizes(const QuantizeDescriptor* descriptors, int32_t count, int64_t total_blocks,
                            cudaStream_t stream);

// sums[i] = the sum of WordHash over piece i (one block a piece). `pieces` and `sums`
// are in device memory, and so is what the pieces point at.
cudaError_t LaunchHashes(const HashPiece* pieces, int32_t count, uint64_t* sums, cudaStream_t stream);

}  // namespace shardsync::executor

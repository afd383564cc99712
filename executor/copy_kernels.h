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

// sums[i] = the sum of WordHash over piece i of `data` (one block a piece). `pieces` and
// `sums` are in device memory.
cudaError_t LaunchHashes(const uint8_t* data, const HashPiece* pieces, int32_t count, uint64_t* sums,
                         cudaStream_t stream);

}  // namespace shardsync::executor

#include "executor/copy_kernels.h"

namespace shardsync::executor {
namespace {

__device__ int64_t Offset(const CopyDescriptor& d, int64_t element, const int64_t* strides) {
  int64_t offset = 0;
  for (int k = d.axes - 1; k >= 0; --k) {
    offset += (element % d.shape[k]) * strides[k];
    element /= d.shape[k];
  }
  return offset;
}

__device__ uint16_t ToBFloat16(uint32_t bits) {
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__device__ void CopyElement(const uint8_t* from, uint8_t* to, const CopyDescriptor& d) {
  if (d.fill) {
    for (int b = 0; b < d.dst_bytes; ++b) to[b] = 0;
  } else if (d.convert) {
    *reinterpret_cast<uint16_t*>(to) = ToBFloat16(*reinterpret_cast<const uint32_t*>(from));
  } else if (d.dst_bytes == 2) {
    *reinterpret_cast<uint16_t*>(to) = *reinterpret_cast<const uint16_t*>(from);
  } else if (d.dst_bytes == 4) {
    *reinterpret_cast<uint32_t*>(to) = *reinterpret_cast<const uint32_t*>(from);
  } else if (d.dst_bytes == 8) {
    *reinterpret_cast<uint64_t*>(to) = *reinterpret_cast<const uint64_t*>(from);
  } else {
    for (int b = 0; b < d.dst_bytes; ++b) to[b] = from[b];
  }
}

__global__ void CopyKernel(const CopyDescriptor* descriptors, const int64_t* first_block, int32_t count) {
  // Which descriptor this block serves: the last whose first block is <= ours.
  int32_t lo = 0, hi = count - 1;
  const int64_t block = blockIdx.x;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= block) lo = mid; else hi = mid - 1;
  }
  const CopyDescriptor& d = descriptors[lo];
  const int64_t start = (block - first_block[lo]) * kElementsPerBlock;
  const int64_t end = min(d.count, start + kElementsPerBlock);
  const bool runs = d.axes == 1 && (d.src_packed || d.src_strides[0] == 1) && (d.dst_packed || d.dst_strides[0] == 1);
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    const int64_t element = d.begin + i;
    int64_t src, dst;
    if (runs) {  // contiguous on both sides: no index arithmetic
      src = d.src_packed ? i : element;
      dst = d.dst_packed ? i : element;
    } else {
      src = d.src_packed ? i : Offset(d, element, d.src_strides);
      dst = d.dst_packed ? i : Offset(d, element, d.dst_strides);
    }
    CopyElement(d.src + src * d.src_bytes, d.dst + dst * d.dst_bytes, d);
  }
}

}  // namespace

cudaError_t LaunchCopies(const CopyDescriptor* descriptors, const int64_t* first_block, int32_t count,
                         int64_t total_blocks, cudaStream_t stream) {
  if (count == 0 || total_blocks == 0) return cudaSuccess;
  CopyKernel<<<static_cast<unsigned>(total_blocks), 256, 0, stream>>>(descriptors, first_block, count);
  return cudaGetLastError();
}

}  // namespace shardsync::executor

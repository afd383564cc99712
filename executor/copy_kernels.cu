#include <cuda_fp8.h>

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
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
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

// `threads` threads (`thread` is this one's index among them) copy `bytes` bytes
// together: 16 bytes at a time where source and destination share their alignment,
// else 4, 2 or 1.
// Two 16-byte loads in flight per thread before their stores, to hide memory latency
// (bench/copy_bench times the copies against a flat memcpy).
constexpr int kUnroll = 2;

// Rows up to this long are copied a warp each (16 KiB: 32 lanes x 16 bytes x 32).
constexpr int64_t kShortRowBytes = 16 << 10;

__device__ void CooperativeCopy(const uint8_t* src, uint8_t* dst, int64_t bytes, int thread, int threads) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(src), d = reinterpret_cast<uintptr_t>(dst);
  int width = 1;
  if (((s ^ d) & 15) == 0)
    width = 16;
  else if (((s ^ d) & 3) == 0)
    width = 4;
  else if (((s ^ d) & 1) == 0)
    width = 2;
  // Bytes before the first aligned address, one by one.
  const int64_t misaligned = (width - static_cast<int64_t>(s & (width - 1))) & (width - 1);
  const int64_t head = bytes < misaligned ? bytes : misaligned;
  for (int64_t i = thread; i < head; i += threads) dst[i] = src[i];
  const int64_t words = (bytes - head) / width;
  const uint8_t* ws = src + head;
  uint8_t* wd = dst + head;
  if (width == 16) {
    const uint4* __restrict__ from = reinterpret_cast<const uint4*>(ws);
    uint4* __restrict__ to = reinterpret_cast<uint4*>(wd);
    int64_t i = thread;
    // Loads first, then stores: kUnroll 16-byte loads in flight per thread.
    for (; i + (kUnroll - 1) * static_cast<int64_t>(threads) < words; i += kUnroll * threads) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = from[i + u * threads];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) to[i + u * threads] = v[u];
    }
    for (; i < words; i += threads) to[i] = from[i];
  } else if (width == 4) {
    for (int64_t i = thread; i < words; i += threads)
      reinterpret_cast<uint32_t*>(wd)[i] = reinterpret_cast<const uint32_t*>(ws)[i];
  } else if (width == 2) {
    for (int64_t i = thread; i < words; i += threads)
      reinterpret_cast<uint16_t*>(wd)[i] = reinterpret_cast<const uint16_t*>(ws)[i];
  } else {
    for (int64_t i = thread; i < words; i += threads) wd[i] = ws[i];
  }
  for (int64_t i = head + words * width + thread; i < bytes; i += threads) dst[i] = src[i];
}

__global__ void CopyKernel(const CopyDescriptor* descriptors, const int64_t* first_block, int32_t count) {
  // Which descriptor this block serves: the last whose first block is <= ours.
  int32_t lo = 0, hi = count - 1;
  const int64_t block = blockIdx.x;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (first_block[mid] <= block)
      lo = mid;
    else
      hi = mid - 1;
  }
  const CopyDescriptor& d = descriptors[lo];
  const int64_t start = (block - first_block[lo]) * kElementsPerBlock;
  const int64_t end = min(d.count, start + kElementsPerBlock);
  const int last = d.axes - 1;
  const bool rows =
      !d.fill && !d.convert && (d.src_packed || d.src_strides[last] == 1) && (d.dst_packed || d.dst_strides[last] == 1);
  if (rows) {
    // Contiguous along the innermost axis on both sides: copy row pieces as bytes. The
    // pieces of [start, end): the first may start inside a row, the others at a row's
    // start. Short rows get a warp each, so several are in flight at once; long rows
    // get the whole block.
    const int64_t row = d.shape[last];
    const int64_t first = min(end - start, row - (d.begin + start) % row);
    const int64_t pieces = 1 + (end - start - first + row - 1) / row;
    const bool short_rows = row * d.dst_bytes <= kShortRowBytes;
    const int thread = short_rows ? threadIdx.x % 32 : threadIdx.x;
    const int threads = short_rows ? 32 : blockDim.x;
    const int64_t step = short_rows ? blockDim.x / 32 : 1;
    for (int64_t p = short_rows ? threadIdx.x / 32 : 0; p < pieces; p += step) {
      const int64_t i = p == 0 ? start : start + first + (p - 1) * row;
      const int64_t count = p == 0 ? first : min(row, end - i);
      const int64_t element = d.begin + i;
      const int64_t src = d.src_packed ? i : Offset(d, element, d.src_strides);
      const int64_t dst = d.dst_packed ? i : Offset(d, element, d.dst_strides);
      CooperativeCopy(d.src + src * d.src_bytes, d.dst + dst * d.dst_bytes, count * d.dst_bytes, thread, threads);
    }
    return;
  }
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

constexpr int kHashThreads = 256;

__global__ void HashKernel(const HashPiece* pieces, uint64_t* sums) {
  const HashPiece p = pieces[blockIdx.x];
  const uint64_t* words = reinterpret_cast<const uint64_t*>(p.data);  // 8-byte aligned
  const int64_t whole = p.bytes / 8;
  uint64_t sum = 0;
  for (int64_t w = threadIdx.x; w < whole; w += blockDim.x) sum += WordHash(p.first_word + w, words[w]);
  if (threadIdx.x == 0 && p.bytes % 8 != 0) {
    uint64_t tail = 0;
    const uint8_t* bytes = p.data + whole * 8;
    for (int b = 0; b < p.bytes % 8; ++b) tail |= static_cast<uint64_t>(bytes[b]) << (8 * b);
    sum += WordHash(p.first_word + whole, tail);
  }
  // The block's sum: within each warp, then across warps.
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ uint64_t warp_sums[kHashThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t total = 0;
    for (int w = 0; w < kHashThreads / 32; ++w) total += warp_sums[w];
    sums[blockIdx.x] = total;
  }
}

constexpr int kQuantizeThreads = 256;
constexpr int kQuantizeBlock = 128;  // planner::kScaleBlock
// The vector path: a thread holds 8 consecutive columns (16 bytes of bfloat16 in, 8
// bytes of float8 out) of 8 rows, 16 rows apart.
constexpr int kVectorColumns = 8;
constexpr int kVectorThreadsPerRow = kQuantizeBlock / kVectorColumns;        // 16
constexpr int kVectorRowsPerPass = kQuantizeThreads / kVectorThreadsPerRow;  // 16
constexpr int kVectorPasses = kQuantizeBlock / kVectorRowsPerPass;           // 8

__device__ float BFloat16ToFloat(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// |x| where x counts toward a block's amax (finite), else 0: an infinity saturates to
// +-448 and NaN stays NaN without moving the scale (block_quantize.h).
__device__ float FiniteMagnitude(float x) { return isfinite(x) ? fabsf(x) : 0.0f; }

__device__ uint8_t ToFloat8(float value, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(value, scale), __NV_SATFINITE, __NV_E4M3));
}

// The block's amax (every thread's `amax` reduced), its scale written by thread 0 and
// returned to every thread.
__device__ float BlockScaleOf(float amax, float* scale_out) {
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_down_sync(0xffffffffu, amax, offset));
  __shared__ float warp_amax[kQuantizeThreads / 32];
  __shared__ float block_scale;
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x == 0) {
    float most = 0;
    for (int w = 0; w < kQuantizeThreads / 32; ++w) most = fmaxf(most, warp_amax[w]);
    block_scale = most > 0 ? __fdiv_rn(most, 448.0f) : 1.0f;
    *scale_out = block_scale;
  }
  __syncthreads();
  return block_scale;
}

// One 128 x 128 block of one placement: its amax, its scale, its float8 elements (the
// rule of executor/block_quantize.h, with IEEE float32 division).
__global__ void __launch_bounds__(kQuantizeThreads, 3)
    QuantizeKernel(const QuantizeDescriptor* descriptors, int32_t count) {
  int32_t lo = 0, hi = count - 1;  // the descriptor whose blocks hold blockIdx.x
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (descriptors[mid].first_block <= static_cast<int64_t>(blockIdx.x)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const QuantizeDescriptor d = descriptors[lo];
  const int64_t block = blockIdx.x - d.first_block;
  const int64_t blocks_per_row = (d.cols + kQuantizeBlock - 1) / kQuantizeBlock;
  const int64_t row0 = block / blocks_per_row * kQuantizeBlock;
  const int64_t col0 = block % blocks_per_row * kQuantizeBlock;
  float* scale = reinterpret_cast<float*>(d.scale) + row0 / kQuantizeBlock * d.scale_row_stride + col0 / kQuantizeBlock;
  float amax = 0;
  // Rows of whole 16-byte groups, aligned on both sides: vector loads and stores, the
  // block held in registers as loaded (bfloat16), so memory is read once.
  const bool vector = d.cols % kVectorColumns == 0 && reinterpret_cast<uintptr_t>(d.scratch) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(d.target) % 8 == 0 && d.target_row_stride % 8 == 0;
  if (vector) {
    const int64_t col = col0 + threadIdx.x % kVectorThreadsPerRow * kVectorColumns;
    const int first_row = threadIdx.x / kVectorThreadsPerRow;
    uint32_t words[kVectorPasses][4];
#pragma unroll
    for (int pass = 0; pass < kVectorPasses; ++pass) {
      const int64_t row = row0 + pass * kVectorRowsPerPass + first_row;
      uint4 packed = make_uint4(0, 0, 0, 0);
      if (row < d.rows && col < d.cols) {
        packed = *reinterpret_cast<const uint4*>(d.scratch + 2 * (row * d.cols + col));
      }
      words[pass][0] = packed.x;
      words[pass][1] = packed.y;
      words[pass][2] = packed.z;
      words[pass][3] = packed.w;
    }
#pragma unroll
    for (int pass = 0; pass < kVectorPasses; ++pass) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        amax = fmaxf(amax, FiniteMagnitude(BFloat16ToFloat(words[pass][w] & 0xffffu)));
        amax = fmaxf(amax, FiniteMagnitude(BFloat16ToFloat(words[pass][w] >> 16)));
      }
    }
    const float block_scale = BlockScaleOf(amax, scale);
#pragma unroll
    for (int pass = 0; pass < kVectorPasses; ++pass) {
      const int64_t row = row0 + pass * kVectorRowsPerPass + first_row;
      if (row >= d.rows || col >= d.cols) continue;
      uint32_t out[2] = {0, 0};
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t bits = (k % 2 == 0 ? words[pass][k / 2] & 0xffffu : words[pass][k / 2] >> 16);
        out[k / 4] |= uint32_t{ToFloat8(BFloat16ToFloat(bits), block_scale)} << (8 * (k % 4));
      }
      *reinterpret_cast<uint2*>(d.target + row * d.target_row_stride + col) = make_uint2(out[0], out[1]);
    }
    return;
  }
  // Any other block, an element at a time: read for the amax, then again (from cache)
  // for the quantize.
  const uint16_t* scratch = reinterpret_cast<const uint16_t*>(d.scratch);
  const int rows = static_cast<int>(d.rows - row0 < kQuantizeBlock ? d.rows - row0 : kQuantizeBlock);
  const int cols = static_cast<int>(d.cols - col0 < kQuantizeBlock ? d.cols - col0 : kQuantizeBlock);
  for (int i = threadIdx.x; i < rows * cols; i += kQuantizeThreads) {
    amax = fmaxf(amax, FiniteMagnitude(BFloat16ToFloat(scratch[(row0 + i / cols) * d.cols + col0 + i % cols])));
  }
  const float block_scale = BlockScaleOf(amax, scale);
  for (int i = threadIdx.x; i < rows * cols; i += kQuantizeThreads) {
    const int64_t row = row0 + i / cols, col = col0 + i % cols;
    d.target[row * d.target_row_stride + col] = ToFloat8(BFloat16ToFloat(scratch[row * d.cols + col]), block_scale);
  }
}

}  // namespace

cudaError_t LaunchQuantizes(const QuantizeDescriptor* descriptors, int32_t count, int64_t total_blocks,
                            cudaStream_t stream) {
  if (count == 0 || total_blocks == 0) return cudaSuccess;
  QuantizeKernel<<<static_cast<unsigned>(total_blocks), kQuantizeThreads, 0, stream>>>(descriptors, count);
  return cudaGetLastError();
}

cudaError_t LaunchHashes(const HashPiece* pieces, int32_t count, uint64_t* sums, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  HashKernel<<<static_cast<unsigned>(count), kHashThreads, 0, stream>>>(pieces, sums);
  return cudaGetLastError();
}

cudaError_t LaunchCopies(const CopyDescriptor* descriptors, const int64_t* first_block, int32_t count,
                         int64_t total_blocks, cudaStream_t stream) {
  if (count == 0 || total_blocks == 0) return cudaSuccess;
  CopyKernel<<<static_cast<unsigned>(total_blocks), 256, 0, stream>>>(descriptors, first_block, count);
  return cudaGetLastError();
}

}  // namespace shardsync::executor

#include "executor/cuda_device.h"

#include <cuda_runtime.h>

#include "executor/cuda_check.h"

namespace shardsync::executor {
namespace {

// A segment's piece [begin, end) as a descriptor; `src`/`dst` null on a packed side.
CopyDescriptor Describe(const planner::Segment& s, int64_t begin, int64_t end, const uint8_t* src, uint8_t* dst,
                        bool src_packed, bool dst_packed) {
  CopyDescriptor d{};
  d.src = src;
  d.dst = dst;
  d.begin = begin;
  d.count = end - begin;
  d.axes = s.axes;
  for (int k = 0; k < s.axes; ++k) {
    d.shape[k] = s.shape[k];
    d.src_strides[k] = s.src_strides[k];
    d.dst_strides[k] = s.dst_strides[k];
  }
  d.src_packed = src_packed;
  d.dst_packed = dst_packed;
  d.convert = s.src_dtype != s.dst_dtype;
  // A packed source already holds target-dtype bytes.
  d.src_bytes = static_cast<int32_t>(planner::ElementBytes(src_packed ? s.dst_dtype : s.src_dtype));
  d.dst_bytes = static_cast<int32_t>(planner::ElementBytes(s.dst_dtype));
  if (src_packed) d.convert = 0;
  return d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Open(int ordinal) {
  int count = 0;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", ordinal, " does not exist (", count, " visible)"));
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaStream_t stream, local;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&local, cudaStreamNonBlocking));
  cudaEvent_t local_start, local_end;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&local_start));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&local_end));
  return std::unique_ptr<CudaDevice>(new CudaDevice(ordinal, stream, local, local_start, local_end));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  cudaStreamSynchronize(stream_);
  cudaStreamSynchronize(local_stream_);
  for (auto& [key, staging] : staging_) cudaFree(staging.first);
  cudaFree(network_batch_.device);
  cudaFree(local_batch_.device);
  cudaFree(hash_buffer_);
  cudaEventDestroy(local_start_);
  cudaEventDestroy(local_end_);
  cudaStreamDestroy(stream_);
  cudaStreamDestroy(local_stream_);
}

absl::StatusOr<uint8_t*> CudaDevice::Staging(int32_t peer, bool send, int64_t bytes) {
  auto& [pointer, size] = staging_[{peer, send}];
  if (size != bytes) {
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the old one may be in use
    if (pointer != nullptr) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(pointer));
    pointer = nullptr;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&pointer, bytes));
    size = bytes;
  }
  return pointer;
}

absl::Status CudaDevice::ReleaseStaging(int32_t peer, bool send) {
  auto it = staging_.find({peer, send});
  if (it == staging_.end()) return absl::OkStatus();
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the last user may be queued
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(it->second.first));
  staging_.erase(it);
  return absl::OkStatus();
}

absl::Status CudaDevice::Launch(Batch& batch, cudaStream_t stream) {
  if (batch.descriptors.empty()) return absl::OkStatus();
  batch.first_block.clear();
  int64_t blocks = 0;
  for (const CopyDescriptor& d : batch.descriptors) {
    batch.first_block.push_back(blocks);
    blocks += (d.count + kElementsPerBlock - 1) / kElementsPerBlock;
  }
  batch.first_block.push_back(blocks);
  const size_t descriptor_bytes = batch.descriptors.size() * sizeof(CopyDescriptor);
  const size_t bytes = descriptor_bytes + batch.first_block.size() * sizeof(int64_t);
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  if (bytes > batch.capacity) {
    // The stream may still read the old descriptors: wait before freeing them.
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    if (batch.device != nullptr) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(batch.device));
    batch.device = nullptr;
    batch.capacity = 2 * bytes;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&batch.device, batch.capacity));
  }
  // Copies from pageable memory are staged before the call returns, so the host
  // vectors may be reused at once; stream order keeps the previous launch's reads safe.
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(batch.device, batch.descriptors.data(), descriptor_bytes, cudaMemcpyHostToDevice, stream));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(batch.device + descriptor_bytes, batch.first_block.data(),
                                                 batch.first_block.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                                                 stream));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(LaunchCopies(reinterpret_cast<const CopyDescriptor*>(batch.device),
                                              reinterpret_cast<const int64_t*>(batch.device + descriptor_bytes),
                                              static_cast<int32_t>(batch.descriptors.size()), blocks, stream));
  batch.descriptors.clear();
  return absl::OkStatus();
}

absl::Status CudaDevice::Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                              const BufferTable& buffers, uint8_t* out) {
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    const uint8_t* src = buffers[s.src.buffer] + s.src_base * planner::ElementBytes(s.src_dtype);
    network_batch_.descriptors.push_back(Describe(s, part.begin, part.end, src, out, false, true));
    out += (part.end - part.begin) * planner::ElementBytes(s.dst_dtype);
  }
  return Launch(network_batch_, stream_);
}

absl::Status CudaDevice::Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                                const uint8_t* in, const BufferTable& buffers) {
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    uint8_t* dst = buffers[s.dst.buffer] + s.dst_base * planner::ElementBytes(s.dst_dtype);
    network_batch_.descriptors.push_back(Describe(s, part.begin, part.end, in, dst, true, false));
    in += (part.end - part.begin) * planner::ElementBytes(s.dst_dtype);
  }
  return Launch(network_batch_, stream_);
}

absl::Status CudaDevice::CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                   absl::Span<const int32_t> fills, const BufferTable& buffers) {
  for (int32_t index : segments) {
    const planner::Segment& s = plan.segments[index];
    local_batch_.descriptors.push_back(Describe(
        s, 0, planner::SegmentElements(s), buffers[s.src.buffer] + s.src_base * planner::ElementBytes(s.src_dtype),
        buffers[s.dst.buffer] + s.dst_base * planner::ElementBytes(s.dst_dtype), false, false));
  }
  for (int32_t index : fills) {
    const planner::FillOp& f = plan.fills[index];
    const planner::Segment region = planner::FillRegion(f);
    CopyDescriptor d = Describe(region, 0, planner::SegmentElements(region), nullptr,
                                buffers[f.fill.holder.buffer] + f.fill.base * planner::ElementBytes(f.dtype), true,
                                false);
    d.fill = 1;
    local_batch_.descriptors.push_back(d);
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(local_start_, local_stream_));
  if (auto status = Launch(local_batch_, local_stream_); !status.ok()) return status;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(local_end_, local_stream_));
  return absl::OkStatus();
}

absl::StatusOr<double> CudaDevice::LastLocalSeconds() {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  float milliseconds = 0;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(local_end_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&milliseconds, local_start_, local_end_));
  return milliseconds / 1e3;
}

absl::Status CudaDevice::Synchronize() {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(local_stream_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaDevice::HashPieces(const uint8_t* data, absl::Span<const HashPiece> pieces, uint64_t* sums) {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(local_stream_));
  const size_t piece_bytes = pieces.size() * sizeof(HashPiece);
  const size_t bytes = piece_bytes + pieces.size() * sizeof(uint64_t);
  if (bytes > hash_capacity_) {
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the old buffer may be in use
    if (hash_buffer_ != nullptr) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(hash_buffer_));
    hash_buffer_ = nullptr;
    hash_capacity_ = 2 * bytes;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&hash_buffer_, hash_capacity_));
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(hash_buffer_, pieces.data(), piece_bytes, cudaMemcpyHostToDevice, stream_));
  uint64_t* device_sums = reinterpret_cast<uint64_t*>(hash_buffer_ + piece_bytes);
  SHARDSYNC_CUDA_RETURN_IF_ERROR(LaunchHashes(data, reinterpret_cast<const HashPiece*>(hash_buffer_),
                                              static_cast<int32_t>(pieces.size()), device_sums, stream_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(sums, device_sums, pieces.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace shardsync::executor

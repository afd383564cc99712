#include "executor/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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

// Whole segments, each from its source to its target as `buffers` map them (local
// copies, and direct copies into a peer's mapped target).
void DescribeSegments(const planner::Plan& plan, absl::Span<const int32_t> segments, const BufferTable& buffers,
                      std::vector<CopyDescriptor>& out) {
  for (int32_t index : segments) {
    const planner::Segment& s = plan.segments[index];
    out.push_back(Describe(s, 0, planner::SegmentElements(s),
                           buffers[s.src.buffer] + s.src_base * planner::ElementBytes(s.src_dtype),
                           buffers[s.dst.buffer] + s.dst_base * planner::ElementBytes(s.dst_dtype), false, false));
  }
}

// An event another process created with cudaEventInterprocess, opened here.
class CudaReadyEvent final : public ReadyEvent {
 public:
  CudaReadyEvent(int ordinal, cudaEvent_t event) : ordinal_(ordinal), event_(event) {}
  ~CudaReadyEvent() override {
    cudaSetDevice(ordinal_);
    cudaEventDestroy(event_);
  }
  cudaEvent_t event() const { return event_; }

 private:
  const int ordinal_;
  const cudaEvent_t event_;
};

}  // namespace

absl::StatusOr<DeviceIdentity> IdentifyDevice(int ordinal) {
  int count = 0;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  const auto uuid_of = [](int device) -> absl::StatusOr<std::string> {
    cudaDeviceProp properties{};
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
    const auto* b = reinterpret_cast<const unsigned char*>(properties.uuid.bytes);
    std::string text = "GPU-";
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
      absl::StrAppend(&text, absl::Hex(b[i], absl::kZeroPad2));
    }
    return text;
  };
  DeviceIdentity identity;
  SHARDSYNC_ASSIGN_OR_RETURN(identity.uuid, uuid_of(ordinal));
  for (int other = 0; other < count; ++other) {
    if (other == ordinal) continue;
    int can = 0;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, ordinal, other));
    if (!can) continue;
    SHARDSYNC_ASSIGN_OR_RETURN(std::string uuid, uuid_of(other));
    identity.peer_uuids.push_back(std::move(uuid));
  }
  return identity;
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Open(int ordinal) {
  int count = 0;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", ordinal, " does not exist (", count, " visible)"));
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  int lowest = 0, highest = 0;  // numerically: the highest priority is the smallest number
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  Streams streams{};
  for (cudaStream_t* stream : {&streams.network, &streams.pack, &streams.unpack, &streams.direct}) {
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(stream, cudaStreamNonBlocking, highest));
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&streams.local, cudaStreamNonBlocking, lowest));
  Slots slots{};
  for (SlotEvents& slot : slots) {
    for (cudaEvent_t* event : {&slot.packed, &slot.transferred, &slot.unpacked}) {
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
    }
  }
  std::array<cudaEvent_t, 5> fence;
  for (cudaEvent_t& event : fence) {
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  return std::unique_ptr<CudaDevice>(new CudaDevice(ordinal, streams, slots, fence));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  for (cudaStream_t stream : streams_.all()) cudaStreamSynchronize(stream);
  for (auto& [key, staging] : staging_) cudaFree(staging.first);
  for (Batch* batch : {&pack_batch_, &unpack_batch_, &local_batch_, &direct_batch_}) cudaFree(batch->device);
  cudaFree(hash_pieces_);
  cudaFree(hash_sums_);
  cudaFree(quantize_device_);
  for (const SlotEvents& slot : slots_) {
    for (cudaEvent_t event : {slot.packed, slot.transferred, slot.unpacked}) cudaEventDestroy(event);
  }
  for (cudaEvent_t event : fence_) cudaEventDestroy(event);
  for (auto [start, end] : local_events_) {
    cudaEventDestroy(start);
    cudaEventDestroy(end);
  }
  for (cudaStream_t stream : streams_.all()) cudaStreamDestroy(stream);
}

absl::Status CudaDevice::SynchronizeAll() {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  for (cudaStream_t stream : streams_.all()) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> CudaDevice::Staging(int32_t peer, bool send, int slot, int64_t bytes) {
  auto& [pointer, size] = staging_[{peer, send, slot}];
  if (size != bytes) {
    SHARDSYNC_RETURN_IF_ERROR(SynchronizeAll());  // the old one may be in use
    if (pointer != nullptr) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(pointer));
    pointer = nullptr;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&pointer, bytes));
    size = bytes;
  }
  return pointer;
}

absl::Status CudaDevice::ReleaseStaging(int32_t peer, bool send) {
  SHARDSYNC_RETURN_IF_ERROR(SynchronizeAll());  // the last user may be queued
  for (int slot = 0; slot < planner::kStagingSlots; ++slot) {
    auto it = staging_.find({peer, send, slot});
    if (it == staging_.end()) continue;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(it->second.first));
    staging_.erase(it);
  }
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
                              const BufferTable& buffers, uint8_t* out, int slot) {
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    const uint8_t* src = buffers[s.src.buffer] + s.src_base * planner::ElementBytes(s.src_dtype);
    pack_batch_.descriptors.push_back(Describe(s, part.begin, part.end, src, out, false, true));
    out += (part.end - part.begin) * planner::ElementBytes(s.dst_dtype);
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  // The slot's previous transfer must have read it out.
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(streams_.pack, slots_[slot].transferred, 0));
  SHARDSYNC_RETURN_IF_ERROR(Launch(pack_batch_, streams_.pack));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(slots_[slot].packed, streams_.pack));
  return absl::OkStatus();
}

absl::Status CudaDevice::Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                                const uint8_t* in, const BufferTable& buffers, int slot) {
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    uint8_t* dst = buffers[s.dst.buffer] + s.dst_base * planner::ElementBytes(s.dst_dtype);
    unpack_batch_.descriptors.push_back(Describe(s, part.begin, part.end, in, dst, true, false));
    in += (part.end - part.begin) * planner::ElementBytes(s.dst_dtype);
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(streams_.unpack, slots_[slot].transferred, 0));
  SHARDSYNC_RETURN_IF_ERROR(Launch(unpack_batch_, streams_.unpack));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(slots_[slot].unpacked, streams_.unpack));
  return absl::OkStatus();
}

absl::Status CudaDevice::BeforeTransfer(int slot) {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  // An event never recorded (a slot's first use) is no wait at all.
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(streams_.network, slots_[slot].packed, 0));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(streams_.network, slots_[slot].unpacked, 0));
  return absl::OkStatus();
}

absl::Status CudaDevice::AfterTransfer(int slot) {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(slots_[slot].transferred, streams_.network));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                   absl::Span<const int32_t> fills, const BufferTable& buffers) {
  DescribeSegments(plan, segments, buffers, local_batch_.descriptors);
  for (int32_t index : fills) {
    const planner::FillOp& f = plan.fills[index];
    const planner::Segment region = planner::FillRegion(f);
    CopyDescriptor d =
        Describe(region, 0, planner::SegmentElements(region), nullptr,
                 buffers[f.fill.holder.buffer] + f.fill.base * planner::ElementBytes(f.dtype), true, false);
    d.fill = 1;
    local_batch_.descriptors.push_back(d);
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  if (local_timed_ == local_events_.size()) {
    cudaEvent_t start, end;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end));
    local_events_.emplace_back(start, end);
  }
  const auto [start, end] = local_events_[local_timed_++];
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, streams_.local));
  SHARDSYNC_RETURN_IF_ERROR(Launch(local_batch_, streams_.local));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(end, streams_.local));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyDirect(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                    const BufferTable& buffers) {
  DescribeSegments(plan, segments, buffers, direct_batch_.descriptors);
  return Launch(direct_batch_, streams_.direct);
}

absl::Status CudaDevice::FinishDirect() {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.direct));
  return absl::OkStatus();
}

absl::Status CudaDevice::Quantize(const planner::Plan& plan, absl::Span<const int32_t> quantizes,
                                  const BufferTable& buffers) {
  quantize_descriptors_.clear();
  int64_t blocks = 0;
  for (int32_t index : quantizes) {
    const planner::QuantizeOp& q = plan.quantizes[index];
    quantize_descriptors_.push_back(QuantizeDescriptor{
        buffers[q.scratch.buffer] + q.scratch_base * planner::ElementBytes(planner::DType::kBFloat16),
        buffers[q.target.buffer] + q.target_base, buffers[q.scale.buffer] + q.scale_base * sizeof(float), q.rows,
        q.cols, q.target_row_stride, q.scale_row_stride, blocks});
    blocks += planner::ScaleBlocks(q.rows) * planner::ScaleBlocks(q.cols);
  }
  if (blocks == 0) return absl::OkStatus();
  SHARDSYNC_RETURN_IF_ERROR(Fence());  // after this stage's copies and receives, on every stream
  if (quantize_descriptors_.size() > quantize_capacity_) {
    // The local stream may still read the old descriptors: wait before freeing them.
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.local));
    if (quantize_device_ != nullptr) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaFree(quantize_device_));
    quantize_device_ = nullptr;
    quantize_capacity_ = 2 * quantize_descriptors_.size();
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&quantize_device_, quantize_capacity_ * sizeof(QuantizeDescriptor)));
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(quantize_device_, quantize_descriptors_.data(),
                                                 quantize_descriptors_.size() * sizeof(QuantizeDescriptor),
                                                 cudaMemcpyHostToDevice, streams_.local));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      LaunchQuantizes(quantize_device_, static_cast<int32_t>(quantize_descriptors_.size()), blocks, streams_.local));
  return absl::OkStatus();
}

absl::Status CudaDevice::Fence() {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  const std::array<cudaStream_t, 5> streams = streams_.all();
  for (size_t i = 0; i < streams.size(); ++i) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(fence_[i], streams[i]));
  for (cudaStream_t stream : streams) {
    for (cudaEvent_t event : fence_) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event, 0));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ReadyEvent>> CudaDevice::OpenReadyEvent(const std::string& handle) {
  if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("a ready event handle is ", sizeof(cudaIpcEventHandle_t),
                                                   " bytes (cudaIpcEventHandle_t), not ", handle.size()));
  }
  cudaIpcEventHandle_t ipc;
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  cudaEvent_t event;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&event, ipc));
  return std::shared_ptr<const ReadyEvent>(new CudaReadyEvent(ordinal_, event));
}

absl::Status CudaDevice::WaitFor(absl::Span<const std::shared_ptr<const ReadyEvent>> events) {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  for (const std::shared_ptr<const ReadyEvent>& ready : events) {
    const cudaEvent_t event = static_cast<const CudaReadyEvent&>(*ready).event();
    // Every stream reads sources: local and direct copies, packs, and unstaged sends.
    for (cudaStream_t stream : streams_.all()) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, event, 0));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> CudaDevice::TakeLocalSeconds() {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  double seconds = 0;
  for (size_t i = 0; i < local_timed_; ++i) {
    float milliseconds = 0;
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(local_events_[i].second));
    SHARDSYNC_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&milliseconds, local_events_[i].first, local_events_[i].second));
    seconds += milliseconds / 1e3;
  }
  local_timed_ = 0;
  return seconds;
}

absl::Status CudaDevice::Synchronize() { return SynchronizeAll(); }

absl::Status CudaDevice::QueueHashes(absl::Span<const HashPiece> pieces) {
  if (pieces.empty()) return absl::OkStatus();
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  const cudaStream_t stream = streams_.pack;
  if (hash_queued_ + pieces.size() > hash_sums_capacity_ || pieces.size() > hash_pieces_capacity_) {
    SHARDSYNC_RETURN_IF_ERROR(DrainHashes());  // the stream is idle after it
    if (pieces.size() > hash_pieces_capacity_) {
      cudaFree(hash_pieces_);
      hash_pieces_ = nullptr;
      hash_pieces_capacity_ = pieces.size();
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&hash_pieces_, hash_pieces_capacity_ * sizeof(HashPiece)));
    }
    if (pieces.size() > hash_sums_capacity_) {
      cudaFree(hash_sums_);
      hash_sums_ = nullptr;
      hash_sums_capacity_ = std::max<size_t>(pieces.size(), 1 << 16);
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&hash_sums_, hash_sums_capacity_ * sizeof(uint64_t)));
    }
  }
  // In stream order: the previous batch's hashes have read hash_pieces_ before this copy.
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(hash_pieces_, pieces.data(), pieces.size() * sizeof(HashPiece), cudaMemcpyHostToDevice, stream));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      LaunchHashes(hash_pieces_, static_cast<int32_t>(pieces.size()), hash_sums_ + hash_queued_, stream));
  hash_queued_ += pieces.size();
  return absl::OkStatus();
}

absl::Status CudaDevice::DrainHashes() {
  const size_t first = hash_collected_.size();
  hash_collected_.resize(first + hash_queued_);
  if (hash_queued_ > 0) {
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(hash_collected_.data() + first, hash_sums_,
                                                   hash_queued_ * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                                                   streams_.pack));
  }
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(streams_.pack));
  hash_queued_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> CudaDevice::CollectHashes() {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  SHARDSYNC_RETURN_IF_ERROR(DrainHashes());
  std::vector<uint64_t> sums;
  sums.swap(hash_collected_);
  return sums;
}

}  // namespace shardsync::executor

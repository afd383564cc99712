// One CUDA device: copies run as batched kernels on the agent's stream (packs, unpacks)
// and a second stream (local copies and fills, beside the network rounds). Staging is
// device memory, allocated once per peer and direction and reused.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "executor/copy_kernels.h"
#include "executor/device.h"

namespace shardsync::executor {

class CudaDevice final : public Device {
 public:
  // Creates the streams on `ordinal`; fails when there is no such device.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Open(int ordinal);
  ~CudaDevice() override;

  absl::string_view name() const override { return "cuda"; }
  int ordinal() const { return ordinal_; }
  cudaStream_t stream() const { return stream_; }  // the transport enqueues here too
  absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int64_t bytes) override;
  absl::Status ReleaseStaging(int32_t peer, bool send) override;
  absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const BufferTable& buffers,
                    uint8_t* out) override;
  absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                      const BufferTable& buffers) override;
  absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments, absl::Span<const int32_t> fills,
                         const BufferTable& buffers) override;
  absl::Status Synchronize() override;
  absl::Status HashPieces(const uint8_t* data, absl::Span<const HashPiece> pieces, uint64_t* sums) override;
  absl::StatusOr<double> LastLocalSeconds() override;

 private:
  // Descriptors of one launch and their device copy, per stream.
  struct Batch {
    std::vector<CopyDescriptor> descriptors;
    std::vector<int64_t> first_block;
    uint8_t* device = nullptr;  // descriptors, then first_block
    size_t capacity = 0;
  };
  CudaDevice(int ordinal, cudaStream_t stream, cudaStream_t local_stream, cudaEvent_t local_start,
             cudaEvent_t local_end)
      : ordinal_(ordinal),
        stream_(stream),
        local_stream_(local_stream),
        local_start_(local_start),
        local_end_(local_end) {}
  absl::Status Launch(Batch& batch, cudaStream_t stream);

  const int ordinal_;
  cudaStream_t stream_;
  cudaStream_t local_stream_;
  cudaEvent_t local_start_;  // around the last CopyLocal on local_stream_
  cudaEvent_t local_end_;
  Batch network_batch_;
  Batch local_batch_;
  uint8_t* hash_buffer_ = nullptr;  // HashPieces: the pieces, then their sums
  size_t hash_capacity_ = 0;
  std::map<std::pair<int32_t, bool>, std::pair<uint8_t*, int64_t>> staging_;
};

}  // namespace shardsync::executor

// Device memory backend: buffers opened from CUDA IPC memory handles on this agent's
// device. A PyTorch tensor from the caching allocator shares its whole segment's handle
// and an offset inside it; the agent checks that offset + size fits the allocation.
// (Expandable segments cannot export such handles: the client refuses them and says to
// set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False.)
#pragma once

#include "executor/memory.h"

namespace shardsync::executor {

class CudaIpcBackend final : public MemoryBackend {
 public:
  explicit CudaIpcBackend(int ordinal) : ordinal_(ordinal) {}
  absl::string_view name() const override { return "cuda-ipc"; }
  bool Accepts(const MemoryHandle& handle) const override { return !handle.cuda_ipc_handle.empty(); }
  // Contract: the mapping is closed (cudaIpcCloseMemHandle) when the returned buffer is
  // destroyed; the client's memory itself is never freed by the agent.
  absl::StatusOr<std::unique_ptr<MappedBuffer>> Open(const MemoryHandle& handle, int64_t bytes) override;
  // Any device of this host: peer access is enabled as the handle is opened.
  absl::StatusOr<std::unique_ptr<MappedBuffer>> OpenPeer(const MemoryHandle& handle, int64_t bytes) override;
  // cudaMalloc on this device, with its IPC handle; cudaFree when the buffer is destroyed.
  absl::StatusOr<Owned> Allocate(int64_t bytes) override;

 private:
  absl::StatusOr<std::unique_ptr<MappedBuffer>> OpenOn(const MemoryHandle& handle, int64_t bytes, bool own_device);

  int ordinal_;
};

}  // namespace shardsync::executor

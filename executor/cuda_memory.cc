#include "executor/cuda_memory.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "executor/cuda_check.h"

namespace shardsync::executor {
namespace {

class CudaIpcBuffer final : public MappedBuffer {
 public:
  CudaIpcBuffer(int ordinal, void* mapping, uint8_t* data, int64_t bytes)
      : ordinal_(ordinal), mapping_(mapping), data_(data), bytes_(bytes) {}
  ~CudaIpcBuffer() override {
    cudaSetDevice(ordinal_);
    cudaIpcCloseMemHandle(mapping_);
  }
  uint8_t* data() const override { return data_; }
  int64_t bytes() const override { return bytes_; }
  bool on_device() const override { return true; }

 private:
  int ordinal_;
  void* mapping_;
  uint8_t* data_;
  int64_t bytes_;
};

// Device memory this process allocated (CudaIpcBackend::Allocate).
class OwnedCudaBuffer final : public MappedBuffer {
 public:
  OwnedCudaBuffer(int ordinal, uint8_t* data, int64_t bytes) : ordinal_(ordinal), data_(data), bytes_(bytes) {}
  ~OwnedCudaBuffer() override {
    cudaSetDevice(ordinal_);
    cudaFree(data_);
  }
  uint8_t* data() const override { return data_; }
  int64_t bytes() const override { return bytes_; }
  bool on_device() const override { return true; }

 private:
  int ordinal_;
  uint8_t* data_;
  int64_t bytes_;
};

// The size of the allocation `pointer` lies in, through the driver's entry point (so
// the agent does not link libcuda, which machines without a GPU lack).
absl::StatusOr<int64_t> AllocationBytes(void* pointer) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &function, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || function == nullptr) {
    return absl::InternalError("the CUDA driver has no cuMemGetAddressRange");
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  if (reinterpret_cast<GetAddressRange>(function)(&base, &size, reinterpret_cast<CUdeviceptr>(pointer)) !=
      CUDA_SUCCESS) {
    return absl::InternalError("cuMemGetAddressRange failed on an opened IPC handle");
  }
  return static_cast<int64_t>(size - (reinterpret_cast<CUdeviceptr>(pointer) - base));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedBuffer>> CudaIpcBackend::Open(const MemoryHandle& handle, int64_t bytes) {
  return OpenOn(handle, bytes, /*own_device=*/true);
}

absl::StatusOr<std::unique_ptr<MappedBuffer>> CudaIpcBackend::OpenPeer(const MemoryHandle& handle, int64_t bytes) {
  return OpenOn(handle, bytes, /*own_device=*/false);
}

absl::StatusOr<MemoryBackend::Owned> CudaIpcBackend::Allocate(int64_t bytes) {
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  void* data = nullptr;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  Owned owned;
  owned.buffer = std::make_unique<OwnedCudaBuffer>(ordinal_, static_cast<uint8_t*>(data), bytes);
  cudaIpcMemHandle_t ipc;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&ipc, data));
  owned.handle.cuda_ipc_handle.assign(reinterpret_cast<const char*>(&ipc), sizeof(ipc));
  owned.handle.device = ordinal_;
  return owned;
}

absl::StatusOr<std::unique_ptr<MappedBuffer>> CudaIpcBackend::OpenOn(const MemoryHandle& handle, int64_t bytes,
                                                                     bool own_device) {
  if (handle.cuda_ipc_handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle has ", sizeof(cudaIpcMemHandle_t), " bytes, not ",
                                                   handle.cuda_ipc_handle.size()));
  }
  if (own_device && handle.device != ordinal_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the buffer is on CUDA device ", handle.device, "; this agent serves device ", ordinal_));
  }
  if (bytes < 0 || handle.offset_bytes < 0) return absl::InvalidArgumentError("negative size or offset");
  cudaIpcMemHandle_t ipc;
  std::memcpy(&ipc, handle.cuda_ipc_handle.data(), sizeof(ipc));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  void* mapping = nullptr;
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&mapping, ipc, cudaIpcMemLazyEnablePeerAccess));
  auto allocation = AllocationBytes(mapping);
  if (!allocation.ok() || handle.offset_bytes + bytes > *allocation) {
    cudaIpcCloseMemHandle(mapping);
    if (!allocation.ok()) return allocation.status();
    return absl::InvalidArgumentError(absl::StrCat("the IPC allocation holds ", *allocation,
                                                   " bytes; the registration claims ", bytes, " at offset ",
                                                   handle.offset_bytes));
  }
  return std::unique_ptr<MappedBuffer>(
      new CudaIpcBuffer(ordinal_, mapping, static_cast<uint8_t*>(mapping) + handle.offset_bytes, bytes));
}

}  // namespace shardsync::executor

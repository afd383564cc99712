// CUDA and NCCL results become absl::Status here, once, with the call named.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardsync::executor {

inline absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

inline absl::Status NcclStatus(ncclResult_t result, const char* call) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(call, ": ", ncclGetErrorString(result)));
}

}  // namespace shardsync::executor

// Returns the converted status from the enclosing function when a call fails.
#define SHARDSYNC_CUDA_RETURN_IF_ERROR(call)                                                                        \
  do {                                                                                                              \
    if (::absl::Status shardsync_status = ::shardsync::executor::CudaStatus((call), #call); !shardsync_status.ok()) \
      return shardsync_status;                                                                                      \
  } while (false)

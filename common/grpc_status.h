// absl::Status inside, grpc::Status only at service edges: converted here, once.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace shardsync {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace shardsync

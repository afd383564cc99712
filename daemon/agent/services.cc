#include "daemon/agent/services.h"

#include <algorithm>

#include "common/grpc_status.h"

namespace shardsync::agent {

grpc::Status ControlService::Execute(grpc::ServerContext*, const v1::ExecuteRequest* request,
                                     v1::ExecuteResponse* response) {
  auto executed = agent_.Execute(*request);
  if (!executed.ok()) return ToGrpcStatus(executed.status());
  *response = *std::move(executed);
  return grpc::Status::OK;
}

grpc::Status ControlService::Transfer(grpc::ServerContext* context, const v1::TransferRequest* request,
                                      v1::TransferResponse*) {
  // A sender always sets a deadline; an hour bounds one that did not.
  const absl::Time deadline = std::min(absl::FromChrono(context->deadline()), absl::Now() + absl::Hours(1));
  return ToGrpcStatus(agent_.Transfer(*request, deadline));
}

grpc::Status ControlService::NewCommunicatorId(grpc::ServerContext*, const v1::NewCommunicatorIdRequest*,
                                               v1::NewCommunicatorIdResponse* response) {
  auto id = agent_.NewCommunicatorId();
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_communicator_id(*std::move(id));
  return grpc::Status::OK;
}

grpc::Status ControlService::TargetMemory(grpc::ServerContext*, const v1::TargetMemoryRequest* request,
                                          v1::TargetMemoryResponse* response) {
  auto answered = agent_.TargetMemory(*request);
  if (!answered.ok()) return ToGrpcStatus(answered.status());
  *response = *std::move(answered);
  return grpc::Status::OK;
}

}  // namespace shardsync::agent

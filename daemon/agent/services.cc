#include "daemon/agent/services.h"

#include <algorithm>

#include "common/grpc_status.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {

grpc::Status LocalService::Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                                    grpc::ServerWriter<v1::RegisterEvent>* writer) {
  const std::optional<Peer> peer = socket_.Find(context->peer());
  if (!peer) return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "the caller's credentials are unknown");
  ClientDesk& desk = agent_.clients();
  if (const absl::Status admitted = desk.Admit(*request, *peer); !admitted.ok()) {
    spdlog::warn("refused registration of '{}': {}", request->client_id(), std::string(admitted.message()));
    return ToGrpcStatus(admitted);
  }
  v1::RegisterEvent event;
  event.set_rank(agent_.rank());
  event.set_layout_epoch(desk.AwaitPublished());
  writer->Write(event);
  while (!context->IsCancelled() && !desk.shutting_down()) absl::SleepFor(absl::Milliseconds(20));
  desk.Withdraw(request->client_id());
  return grpc::Status::OK;
}

ControlService::ControlService(Agent& agent)
    : agent_(agent), watcher_([&agent](const std::string& sync_id) {
        v1::AbortRequest abort;
        abort.set_sync_id(sync_id);
        abort.set_reason("the coordinator's Execute call ended (its connection was lost)");
        agent.Abort(abort);
      }) {}

grpc::Status ControlService::Execute(grpc::ServerContext* context, const v1::ExecuteRequest* request,
                                     v1::ExecuteResponse* response) {
  watcher_.Watch(context, request->sync_id());
  auto executed = agent_.Execute(*request);
  watcher_.Forget(context);
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

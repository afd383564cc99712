// The Coordinator gRPC service: a shell translating proto and status.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "daemon/coordinator/coordinator.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::coordinator {

// The caller's certificate identity (its subject alternative names, else its common
// name, as gRPC reports them), empty for a caller without a verified certificate.
inline std::string PeerIdentity(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  std::vector<std::string> names;
  for (const grpc::string_ref& name : auth->GetPeerIdentity()) names.emplace_back(name.data(), name.size());
  return absl::StrJoin(names, ",");
}

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  explicit CoordinatorService(Coordinator& coordinator) : coordinator_(coordinator) {}

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request, v1::JoinResponse* response) override {
    return Answer(coordinator_.Join(*request, PeerIdentity(*context)), response);
  }
  grpc::Status Publish(grpc::ServerContext* context, const v1::PublishRequest* request,
                       v1::PublishResponse* response) override {
    return Answer(coordinator_.Publish(*request, PeerIdentity(*context)), response);
  }
  grpc::Status Sync(grpc::ServerContext*, const v1::SyncRequest* request, v1::SyncResponse* response) override {
    return Answer(coordinator_.Sync(*request), response);
  }
  grpc::Status Explain(grpc::ServerContext*, const v1::ExplainRequest* request,
                       v1::ExplainResponse* response) override {
    return Answer(coordinator_.Explain(*request), response);
  }
  grpc::Status Status(grpc::ServerContext*, const v1::CoordinatorStatusRequest*,
                      v1::CoordinatorStatus* response) override {
    *response = coordinator_.Status();
    return grpc::Status::OK;
  }

 private:
  template <typename T>
  static grpc::Status Answer(absl::StatusOr<T> result, T* response) {
    if (!result.ok()) return ToGrpcStatus(result.status());
    *response = *std::move(result);
    return grpc::Status::OK;
  }
  Coordinator& coordinator_;
};

}  // namespace shardsync::coordinator

// gRPC service shells over Agent: translate proto and status, nothing else.
#pragma once

#include "daemon/agent/agent.h"
#include "daemon/agent/call_watcher.h"
#include "daemon/agent/local_socket.h"

namespace shardsync::agent {

class LocalService final : public v1::Agent::Service {
 public:
  LocalService(Agent& agent, const LocalSocket& socket) : agent_(agent), socket_(socket) {}
  // Admits the registration, answers with its layout epoch, then holds it until the
  // client goes away (cancel, exit) or the agent shuts down.
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        grpc::ServerWriter<v1::RegisterEvent>* writer) override;
  grpc::Status Status(grpc::ServerContext*, const v1::AgentStatusRequest*, v1::AgentStatus* response) override {
    *response = agent_.Status();
    return grpc::Status::OK;
  }

 private:
  Agent& agent_;
  const LocalSocket& socket_;
};

class ControlService final : public v1::AgentControl::Service {
 public:
  explicit ControlService(Agent& agent);
  grpc::Status Prepare(grpc::ServerContext*, const v1::PrepareRequest* request,
                       v1::PrepareResponse* response) override {
    *response = agent_.Prepare(*request);
    return grpc::Status::OK;
  }
  grpc::Status Execute(grpc::ServerContext*, const v1::ExecuteRequest* request, v1::ExecuteResponse* response) override;
  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest* request, v1::AbortResponse*) override {
    agent_.Abort(*request);
    return grpc::Status::OK;
  }
  grpc::Status Transfer(grpc::ServerContext* context, const v1::TransferRequest* request,
                        v1::TransferResponse*) override;
  grpc::Status NewCommunicatorId(grpc::ServerContext*, const v1::NewCommunicatorIdRequest*,
                                 v1::NewCommunicatorIdResponse* response) override;
  grpc::Status Progress(grpc::ServerContext*, const v1::ProgressRequest*, v1::RankProgress* response) override {
    *response = agent_.Progress();
    return grpc::Status::OK;
  }
  grpc::Status TargetMemory(grpc::ServerContext*, const v1::TargetMemoryRequest* request,
                            v1::TargetMemoryResponse* response) override;

 private:
  Agent& agent_;
  CallWatcher watcher_;  // an Execute whose coordinator call ended aborts its sync
};

}  // namespace shardsync::agent

#include "daemon/coordinator/agent_link.h"

#include <chrono>

#include "common/grpc_polling.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace shardsync::coordinator {
namespace {

class GrpcStartedExecute : public StartedExecute {
 public:
  template <typename PrepareAsync>
  GrpcStartedExecute(absl::Time deadline, PrepareAsync prepare_async, std::chrono::steady_clock::duration poll_for)
      : call_(absl::ToChronoTime(deadline), prepare_async), poll_for_(poll_for) {}

  absl::StatusOr<v1::ExecuteResponse> Await() override {
    v1::ExecuteResponse response;
    const grpc::Status status = call_.Await(&response, poll_for_);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

 private:
  StartedUnaryCall<v1::ExecuteResponse> call_;
  const std::chrono::steady_clock::duration poll_for_;
};

class GrpcLink : public AgentLink {
 public:
  GrpcLink(std::shared_ptr<grpc::Channel> channel, bool poll)
      : channel_(channel),
        stub_(v1::AgentControl::NewStub(std::move(channel))),
        poll_for_(poll ? std::chrono::steady_clock::duration(kPollBeforeSleep)
                       : std::chrono::steady_clock::duration::zero()) {}

  // Prepare, the first call of a sync, waits (within its deadline) for a connection
  // that is being made again, as after a cut link healed; the other calls fail at once.
  absl::StatusOr<v1::PrepareResponse> Prepare(const v1::PrepareRequest& request, absl::Time deadline) override {
    return Call<v1::PrepareResponse>(&v1::AgentControl::Stub::PrepareAsyncPrepare, request, deadline,
                                     /*wait_for_ready=*/true);
  }
  std::unique_ptr<StartedExecute> StartExecute(v1::ExecuteRequest request, absl::Time deadline) override {
    return std::make_unique<GrpcStartedExecute>(
        deadline,
        [this, &request](grpc::ClientContext* context, grpc::CompletionQueue* queue) {
          return stub_->PrepareAsyncExecute(context, request, queue);
        },
        poll_for_);
  }
  absl::Status Abort(const v1::AbortRequest& request, absl::Time deadline) override {
    return Call<v1::AbortResponse>(&v1::AgentControl::Stub::PrepareAsyncAbort, request, deadline).status();
  }
  absl::StatusOr<std::string> NewCommunicatorId(absl::Time deadline) override {
    SHARDSYNC_ASSIGN_OR_RETURN(
        auto response, Call<v1::NewCommunicatorIdResponse>(&v1::AgentControl::Stub::PrepareAsyncNewCommunicatorId,
                                                           v1::NewCommunicatorIdRequest(), deadline));
    return response.communicator_id();
  }
  absl::StatusOr<v1::RankProgress> Progress(absl::Time deadline) override {
    return Call<v1::RankProgress>(&v1::AgentControl::Stub::PrepareAsyncProgress, v1::ProgressRequest(), deadline);
  }
  bool InProcess() const override { return false; }
  bool Connected() const override { return channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY; }

 private:
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> Call(Method prepare_async, const Request& request, absl::Time deadline,
                                bool wait_for_ready = false) {
    Response response;
    const grpc::Status status = UnaryCall(
        absl::ToChronoTime(deadline),
        [&](grpc::ClientContext* context, grpc::CompletionQueue* queue) {
          context->set_wait_for_ready(wait_for_ready);
          return (stub_.get()->*prepare_async)(context, request, queue);
        },
        &response, poll_for_);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AgentControl::Stub> stub_;
  const std::chrono::steady_clock::duration poll_for_;
};

}  // namespace

std::unique_ptr<AgentLink> GrpcAgentLink(const std::string& address, const Credentials& credentials, bool poll) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetMaxReceiveMessageSize(-1);
  return std::make_unique<GrpcLink>(MakeChannel(address, credentials, args), poll);
}

}  // namespace shardsync::coordinator

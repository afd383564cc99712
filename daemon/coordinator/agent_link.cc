#include "daemon/coordinator/agent_link.h"

#include <chrono>

#include "common/grpc_polling.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace shardsync::coordinator {
namespace {

template <typename Response>
class GrpcStartedCall : public StartedCall<Response> {
 public:
  template <typename PrepareAsync>
  GrpcStartedCall(absl::Time deadline, PrepareAsync prepare_async, std::chrono::steady_clock::duration poll_for)
      : call_(absl::ToChronoTime(deadline), prepare_async), poll_for_(poll_for) {}

  absl::StatusOr<Response> Await() override {
    Response response;
    const grpc::Status status = call_.Await(&response, poll_for_);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  }

 private:
  StartedUnaryCall<Response> call_;
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
    return Start<v1::PrepareResponse>(&v1::AgentControl::Stub::PrepareAsyncPrepare, request, deadline,
                                      /*wait_for_ready=*/true)
        ->Await();
  }
  std::unique_ptr<StartedExecute> StartExecute(v1::ExecuteRequest request, absl::Time deadline) override {
    return Start<v1::ExecuteResponse>(&v1::AgentControl::Stub::PrepareAsyncExecute, request, deadline);
  }
  std::unique_ptr<StartedCall<v1::AbortResponse>> StartAbort(const v1::AbortRequest& request,
                                                             absl::Time deadline) override {
    return Start<v1::AbortResponse>(&v1::AgentControl::Stub::PrepareAsyncAbort, request, deadline);
  }
  std::unique_ptr<StartedCall<v1::RankProgress>> StartProgress(absl::Time deadline) override {
    return Start<v1::RankProgress>(&v1::AgentControl::Stub::PrepareAsyncProgress, v1::ProgressRequest(), deadline);
  }
  absl::StatusOr<std::string> NewCommunicatorId(absl::Time deadline) override {
    SHARDSYNC_ASSIGN_OR_RETURN(
        auto response, Start<v1::NewCommunicatorIdResponse>(&v1::AgentControl::Stub::PrepareAsyncNewCommunicatorId,
                                                            v1::NewCommunicatorIdRequest(), deadline)
                           ->Await());
    return response.communicator_id();
  }
  bool InProcess() const override { return false; }
  bool Connected() const override { return channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY; }

 private:
  // `request` is serialized here: the caller need not keep it.
  template <typename Response, typename Request, typename Method>
  std::unique_ptr<StartedCall<Response>> Start(Method prepare_async, const Request& request, absl::Time deadline,
                                               bool wait_for_ready = false) {
    return std::make_unique<GrpcStartedCall<Response>>(
        deadline,
        [&](grpc::ClientContext* context, grpc::CompletionQueue* queue) {
          context->set_wait_for_ready(wait_for_ready);
          return (stub_.get()->*prepare_async)(context, request, queue);
        },
        poll_for_);
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

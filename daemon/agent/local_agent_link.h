// The coordinator's link to an agent in its own process (shardsync-agent
// --serve-coordinator): each call is the call the gRPC service would make, minus the
// network and the thread hand-offs.
#pragma once

#include <memory>
#include <utility>

#include "daemon/agent/agent.h"
#include "daemon/coordinator/agent_link.h"

namespace shardsync::agent {

class LocalAgentLink : public coordinator::AgentLink {
 public:
  explicit LocalAgentLink(Agent& agent) : agent_(agent) {}
  absl::StatusOr<v1::PrepareResponse> Prepare(const v1::PrepareRequest& request, absl::Time) override {
    return agent_.Prepare(request);
  }
  std::unique_ptr<coordinator::StartedExecute> StartExecute(v1::ExecuteRequest request, absl::Time) override {
    return std::make_unique<DeferredExecute>(agent_, std::move(request));
  }
  std::unique_ptr<coordinator::StartedCall<v1::AbortResponse>> StartAbort(const v1::AbortRequest& request,
                                                                          absl::Time) override {
    agent_.Abort(request);
    return std::make_unique<Answered<v1::AbortResponse>>(v1::AbortResponse());
  }
  std::unique_ptr<coordinator::StartedCall<v1::RankProgress>> StartProgress(absl::Time) override {
    return std::make_unique<Answered<v1::RankProgress>>(agent_.Progress());
  }
  absl::StatusOr<std::string> NewCommunicatorId(absl::Time) override { return agent_.NewCommunicatorId(); }
  bool InProcess() const override { return true; }
  bool Connected() const override { return true; }

 private:
  class DeferredExecute : public coordinator::StartedExecute {
   public:
    DeferredExecute(Agent& agent, v1::ExecuteRequest request) : agent_(agent), request_(std::move(request)) {}
    absl::StatusOr<v1::ExecuteResponse> Await() override { return agent_.Execute(request_); }

   private:
    Agent& agent_;
    const v1::ExecuteRequest request_;
  };
  // A call made when it was started.
  template <typename Response>
  class Answered : public coordinator::StartedCall<Response> {
   public:
    explicit Answered(Response response) : response_(std::move(response)) {}
    absl::StatusOr<Response> Await() override { return std::move(response_); }

   private:
    Response response_;
  };

  Agent& agent_;
};

}  // namespace shardsync::agent

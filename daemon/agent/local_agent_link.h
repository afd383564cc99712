// The coordinator's link to an agent in its own process (shardsync-agent
// --serve-coordinator): each call is the call the gRPC service would make, minus the
// network and the thread hand-offs.
#pragma once

#include "daemon/agent/agent.h"
#include "daemon/coordinator/agent_link.h"

namespace shardsync::agent {

class LocalAgentLink : public coordinator::AgentLink {
 public:
  explicit LocalAgentLink(Agent& agent) : agent_(agent) {}
  absl::StatusOr<v1::PrepareResponse> Prepare(const v1::PrepareRequest& request, absl::Time) override {
    return agent_.Prepare(request);
  }
  absl::StatusOr<v1::ExecuteResponse> Execute(const v1::ExecuteRequest& request, absl::Time) override {
    return agent_.Execute(request);
  }
  absl::Status Abort(const v1::AbortRequest& request, absl::Time) override {
    agent_.Abort(request);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> NewCommunicatorId(absl::Time) override { return agent_.NewCommunicatorId(); }
  absl::StatusOr<v1::RankProgress> Progress(absl::Time) override { return agent_.Progress(); }

 private:
  Agent& agent_;
};

}  // namespace shardsync::agent

// How the coordinator reaches one agent: over gRPC, or by direct calls when the agent
// serves the coordinator in its own process (shardsync-agent --serve-coordinator), which
// takes a network hop and two thread wake-ups off every sync of that rank.
// absl::Status throughout; the gRPC link converts at its edge.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::coordinator {

// A call to an agent: over gRPC, sent when it is started. In process, Execute runs in
// Await (it lasts the sync), every other call when started. Await it once, from any one
// thread; dropped unawaited, a sent call is cancelled and an Execute in process never
// runs.
template <typename Response>
class StartedCall {
 public:
  virtual ~StartedCall() = default;
  virtual absl::StatusOr<Response> Await() = 0;
};
using StartedExecute = StartedCall<v1::ExecuteResponse>;

class AgentLink {
 public:
  virtual ~AgentLink() = default;
  // `deadline` bounds the call; a direct call has no transport to bound (the agent
  // keeps its own deadlines).
  virtual absl::StatusOr<v1::PrepareResponse> Prepare(const v1::PrepareRequest& request, absl::Time deadline) = 0;
  // Started calls (StartedCall): one thread reaches every agent at once, and a silent
  // agent holds up only its own answer.
  virtual std::unique_ptr<StartedExecute> StartExecute(v1::ExecuteRequest request, absl::Time deadline) = 0;
  virtual std::unique_ptr<StartedCall<v1::AbortResponse>> StartAbort(const v1::AbortRequest& request,
                                                                     absl::Time deadline) = 0;
  virtual std::unique_ptr<StartedCall<v1::RankProgress>> StartProgress(absl::Time deadline) = 0;
  virtual absl::StatusOr<std::string> NewCommunicatorId(absl::Time deadline) = 0;
  // The agent serves the coordinator in its own process: its calls run on the caller's
  // thread.
  virtual bool InProcess() const = 0;
  // The link is up now (over gRPC: its channel is connected). A call on a link that is
  // not may never reach the agent; one on a link that is may fail after it did.
  virtual bool Connected() const = 0;
};

// An agent at `address` (its AgentControl service). With `poll`, a call polls for its
// answer before it sleeps (common/polling.h): for agents that copy on a GPU, whose
// syncs leave the coordinator's cores idle; not for agents that copy on the host.
std::unique_ptr<AgentLink> GrpcAgentLink(const std::string& address, const Credentials& credentials, bool poll);

}  // namespace shardsync::coordinator

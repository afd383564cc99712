// shardsync-coordinator: what the Coordinator service does, composed of the agent
// directory (joins, publications, layout epochs), the sync runner (plans, Prepare and
// Execute fan-outs, the communicator) and what it knows of every rank's targets.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/limits.h"
#include "common/tls.h"
#include "daemon/coordinator/agent_directory.h"
#include "daemon/coordinator/agent_link.h"
#include "daemon/coordinator/sync_runner.h"
#include "daemon/coordinator/target_validity.h"
#include "planner/cost.h"
#include "planner/quantize.h"
#include "planner/relay.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

struct CoordinatorConfig {
  int32_t world_size = 1;
  int64_t max_tensors = kDefaultMaxTensors;  // in one rank's publication
  planner::RelayMode relay = planner::RelayMode::kAuto;
  DirectMode direct = DirectMode::kAuto;  // which links take the direct path (link_paths.h)
  DeltaMode delta = DeltaMode::kOff;      // which staged links may carry deltas (sync_runner.h)
  // The cost model: the relay choice (kAuto) and Explain's floor (bytes per second).
  planner::Bandwidths bandwidths{360e9, 4200e9, 50e9};
  int64_t staging_bytes = int64_t{128} << 20;             // per peer, both directions
  int64_t scratch_bytes = planner::kDefaultScratchBytes;  // per agent, for block-quantized targets
  absl::Duration rpc_deadline = absl::Seconds(5);         // Prepare, Abort
  absl::Duration sync_timeout = absl::Seconds(60);        // Execute, unless the request says
  Credentials credentials;                                // of the channels to agents: TLS or, if asked, plaintext
  std::vector<uint32_t> shared_source_uids;               // may be sources of one tensor together
  std::string plan_dir = DefaultPlanDir();                // each rank's planned segments, in a file with no name
};

class Coordinator {
 public:
  explicit Coordinator(CoordinatorConfig config);

  // An agent in this process: the one that joins with `incarnation` is called through
  // `link` (direct calls), not over gRPC.
  void SetLocalAgent(const std::string& incarnation, std::shared_ptr<AgentLink> link);

  // Both refuse a request whose fields are out of bounds (a rank outside the world, a
  // missing or oversized name) with INVALID_ARGUMENT, and a Publish from a rank that
  // has not joined with FAILED_PRECONDITION; nothing is changed then. `identity`: the
  // caller's certificate identity (empty without mutual TLS); a rank's first Join ties
  // it to that identity, and a Join or Publish for the rank under another is refused
  // (PERMISSION_DENIED).
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request, const std::string& identity = "");
  absl::StatusOr<v1::PublishResponse> Publish(const v1::PublishRequest& request, const std::string& identity = "");
  absl::StatusOr<v1::SyncResponse> Sync(const v1::SyncRequest& request) { return runner_.Sync(request); }
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& request) { return runner_.Explain(request); }
  v1::CoordinatorStatus Status() const;
  // Prometheus text: syncs started/succeeded/failed, bytes, durations, agents, epoch.
  std::string Metrics() const;

 private:
  std::set<int32_t> InvalidTargetRanks() const;

  const CoordinatorConfig config_;
  // Held while a Join or Publish changes the directory and the validity together, and
  // while both are read: a status never sees one changed without the other.
  mutable absl::Mutex membership_mu_;
  AgentDirectory directory_;
  TargetValidity validity_;
  SyncRunner runner_;
};

}  // namespace shardsync::coordinator

// Runs syncs: plans each layout epoch once (PlanEpoch), then each sync as Prepare on
// every agent and Execute only if all said ok; once the agents hold the epoch's
// schedule and communicator (a sync succeeded since), as one Execute per agent that
// prepares itself. Keeps the NCCL communicator's id and generation, and tells
// TargetValidity what each sync wrote. One sync (or explain) at a time; a Sync that
// arrives while another runs waits for it. The epoch's plans live in a PlanCache and
// what Status and Metrics report in a SyncRecord, each with its own contract.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/coordinator/agent_directory.h"
#include "daemon/coordinator/epoch_plan.h"
#include "daemon/coordinator/link_paths.h"
#include "daemon/coordinator/plan_cache.h"
#include "daemon/coordinator/rank_pool.h"
#include "daemon/coordinator/sync_record.h"
#include "daemon/coordinator/target_validity.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

// Delta sync, on links of CPU agents (host transports): off; across nodes only; on
// every staged link.
enum class DeltaMode { kOff, kAuto, kAlways };

struct SyncOptions {
  EpochOptions epoch;                               // world, relay, bandwidths, staging
  absl::Duration rpc_deadline = absl::Seconds(5);   // Prepare, Abort
  absl::Duration sync_timeout = absl::Seconds(60);  // Execute, unless the request says
  DirectMode direct = DirectMode::kAuto;            // which links take the direct path
  DeltaMode delta = DeltaMode::kOff;                // which staged links may carry deltas
};

// A sync's deadline: the configured one, or a smaller one the request asks for
// (`requested_ms` > 0): a client cannot hold agents longer than the operator allows.
absl::Duration SyncTimeout(int64_t requested_ms, absl::Duration configured);

class SyncRunner {
 public:
  SyncRunner(SyncOptions options, std::string instance_id, AgentDirectory& directory, TargetValidity& validity);

  absl::StatusOr<v1::SyncResponse> Sync(const v1::SyncRequest& request);
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& request);
  // The running sync with every agent's progress, and the last sync's outcome.
  void FillStatus(v1::CoordinatorStatus* status) const;
  void AppendMetrics(std::string* out) const;
  // Frees the plans of an older layout epoch and gives their memory back to the
  // system, unless a sync or explain runs (it frees them when it ends).
  void ReleaseStalePlans();

 private:
  // Points plan_ at the plan of the current epoch that writes the targets of
  // `target_ranks` (empty: every target), planning it unless cached; true when it
  // planned now (no agent holds its schedule yet).
  absl::StatusOr<bool> UsePlan(const std::vector<int32_t>& target_ranks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  void ReleaseStalePlansLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // A partial sync's ranks, ascending and unique; refused unless each holds a target.
  absl::StatusOr<std::vector<int32_t>> SelectTargetRanks(
      const google::protobuf::RepeatedField<int32_t>& requested) const;
  absl::Status PrepareAll(const std::string& sync_id, absl::Duration execute_deadline,
                          const AgentDirectory::Contacts& contacts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // Rank `rank`'s Prepare around `schedule` (ScheduleRequest; none: the agent holds it),
  // with every rank's `addresses` and its signal boards (null: one call, the agent holds
  // this communicator generation's peers: PrepareRequest.peers_cached).
  v1::PrepareRequest PrepareRequestFor(int32_t rank, std::optional<v1::PrepareRequest> schedule,
                                       const std::string& sync_id, absl::Duration execute_deadline,
                                       const std::map<int32_t, std::string>* addresses)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // Groups of ranks that must prepare together (direct peers), by rank.
  std::vector<int32_t> DirectGroups() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // A fresh communicator id from rank 0 when the last one may be broken (an empty one
  // when no link needs NCCL).
  absl::Status RenewCommunicator() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // paths_ for the agents that hold the ranks now (every rank joined).
  absl::Status EnsureLinkPaths() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // sync --verify: every (tensor, target rank)'s checksums compared into `response`;
  // DATA_LOSS naming those that differ.
  absl::Status CheckVerified(const std::vector<v1::ExecuteResponse>& responses, v1::SyncResponse& response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // The plan's fields of a successful sync's response, and every rank's stats (moved
  // out of `responses`); with `links` every link (SyncRequest.links).
  void FillFromPlan(std::vector<v1::ExecuteResponse>& responses, bool links, v1::SyncResponse& response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // Every link of the plan's schedules with its bytes and path.
  std::vector<v1::LinkBytes> LinksOfPlan() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  bool CommunicatorValid() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // Every agent holds the schedule and communicator, and agreeing costs them little:
  // the sync may skip Prepare.
  bool OneCallReady(const AgentDirectory::Contacts& contacts) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  // Execute on every rank (each preparing itself with `one_call`); the responses by
  // rank, or the sync refused (every rank stopped before writing) or failed (targets
  // invalid).
  // Each CPU agent's delta spec for this sync (coordinator --delta): the versions its
  // peers' targets hold, over the links that may carry deltas. None when off, for a
  // plan with block-quantized targets, or for an agent on a device.
  std::map<int32_t, v1::DeltaSpec> DeltaSpecs() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  absl::StatusOr<std::vector<v1::ExecuteResponse>> ExecuteAll(const std::string& sync_id, absl::Duration timeout,
                                                              const v1::SyncRequest& request, bool one_call,
                                                              const AgentDirectory::Contacts& contacts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);

  const SyncOptions options_;
  const std::string instance_id_;
  AgentDirectory& directory_;
  TargetValidity& validity_;

  absl::Mutex sync_mu_;                            // one sync (or explain) at a time
  RankPool phase_pool_ ABSL_GUARDED_BY(sync_mu_);  // Prepare's and Execute's fan-outs
  PlanCache plans_ ABSL_GUARDED_BY(sync_mu_);
  const CachedPlan* plan_ ABSL_GUARDED_BY(sync_mu_) = nullptr;          // the running sync's or explain's
  std::map<int32_t, std::string> delivered_ ABSL_GUARDED_BY(sync_mu_);  // rank -> digest it holds
  // The communicator every agent builds for NCCL: a new id and generation after any
  // failed sync or change of agents (empty ids for host transports).
  std::string communicator_id_ ABSL_GUARDED_BY(sync_mu_);
  int64_t communicator_generation_ ABSL_GUARDED_BY(sync_mu_) = 0;
  int64_t communicator_membership_version_ ABSL_GUARDED_BY(sync_mu_) = -1;  // the directory's, when built; -1: none
  LinkPaths paths_ ABSL_GUARDED_BY(sync_mu_);
  int64_t paths_membership_version_ ABSL_GUARDED_BY(sync_mu_) = -1;  // the directory's, when chosen; -1: none
  int64_t syncs_ ABSL_GUARDED_BY(sync_mu_) = 0;
  // The plan whose schedule every agent holds, with communicator_generation_ built
  // (the last sync ran it and succeeded, nothing planned or renewed since): a sync of
  // that plan is one call per agent. Empty: none.
  std::string ready_digest_ ABSL_GUARDED_BY(sync_mu_);

  SyncRecord record_;  // what Status and Metrics report, also while a sync runs
};

}  // namespace shardsync::coordinator

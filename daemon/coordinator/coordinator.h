// shardsync-coordinator: accepts agents, plans once per layout epoch, and runs each
// sync as Prepare everywhere, then Execute only if every agent said ok; once the
// agents hold the epoch's schedule and communicator (a sync succeeded since), as one
// Execute per agent that prepares itself. One sync at a time; a Sync that arrives
// while another runs waits for it (queued, in arrival order of the mutex).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics_http.h"
#include "common/tls.h"
#include "daemon/coordinator/agent_link.h"
#include "daemon/coordinator/rank_pool.h"
#include "google/protobuf/arena.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/cost.h"
#include "planner/relay.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

struct CoordinatorConfig {
  int32_t world_size = 1;
  planner::RelayMode relay = planner::RelayMode::kAuto;
  // The cost model: the relay choice (kAuto) and Explain's floor (bytes per second).
  planner::Bandwidths bandwidths{360e9, 4200e9, 50e9};
  int64_t staging_bytes = int64_t{128} << 20;  // per peer, both directions
  absl::Duration rpc_deadline = absl::Seconds(5);   // Prepare, Abort
  absl::Duration sync_timeout = absl::Seconds(60);  // Execute, unless the request says
  Credentials credentials;  // of the channels to agents: TLS or, if asked, plaintext
  std::vector<uint32_t> shared_source_uids;  // may be sources of one tensor together
};

// A sync's deadline: the configured one, or a smaller one the request asks for
// (`requested_ms` > 0): a client cannot hold agents longer than the operator allows.
absl::Duration SyncTimeout(int64_t requested_ms, absl::Duration configured);

class Coordinator {
 public:
  explicit Coordinator(CoordinatorConfig config);

  // An agent in this process: the one that joins with `incarnation` is called through
  // `link` (direct calls), not over gRPC.
  void SetLocalAgent(const std::string& incarnation, std::shared_ptr<AgentLink> link);

  // Both refuse a request whose fields are out of bounds (a rank outside the world, a
  // missing or oversized name) with INVALID_ARGUMENT, and a Publish from a rank that
  // has not joined with FAILED_PRECONDITION; nothing is changed then.
  absl::StatusOr<v1::JoinResponse> Join(const v1::JoinRequest& request);
  absl::StatusOr<v1::PublishResponse> Publish(const v1::PublishRequest& request);
  absl::StatusOr<v1::SyncResponse> Sync(const v1::SyncRequest& request);
  absl::StatusOr<v1::ExplainResponse> Explain(const v1::ExplainRequest& request);
  v1::CoordinatorStatus Status() const;
  // Prometheus text: syncs started/succeeded/failed, bytes, durations, agents, epoch.
  std::string Metrics() const;

 private:
  struct AgentEntry {
    v1::JoinRequest join;
    std::shared_ptr<AgentLink> link;  // shared: a sync keeps it while a rejoin replaces it
    absl::Time last_seen;
  };
  // Every joined agent's link and address, by rank.
  std::map<int32_t, std::shared_ptr<AgentLink>> Links() const;
  std::map<int32_t, std::string> Addresses() const;
  // The node index of every rank (JoinRequest.node, numbered in rank order).
  std::vector<int32_t> NodeOfRank() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan of one layout epoch and target selection, encoded per rank.
  struct CachedPlan {
    int64_t epoch = -1;
    std::vector<int32_t> target_ranks;  // whose targets it writes, ascending
    bool partial = false;               // only those asked for, not every target
    planner::Plan plan;
    std::vector<planner::Schedule> schedules;
    std::pair<double, double> floors{0, 0};  // without and with the relay (kAuto, several nodes)
    int64_t network_bytes = 0;               // between nodes
    // By rank, schedule only, owned by `arena` (one allocation pool for millions of
    // segment specs, freed at once with the plan).
    std::unique_ptr<google::protobuf::Arena> arena = std::make_unique<google::protobuf::Arena>();
    std::vector<const v1::PrepareRequest*> requests;
    std::string digest;
    double plan_seconds = 0;
  };

  // Points plan_ at the plan of the current epoch that writes the targets of
  // `target_ranks` (empty: every target), planning it unless cached; true when it
  // planned now. Requires sync_mu_.
  absl::StatusOr<bool> EnsurePlan(const std::vector<int32_t>& target_ranks);
  // Frees the plans of an older layout epoch, and gives their memory back to the
  // system. Requires sync_mu_.
  void ReleaseStalePlans();
  // A partial sync's ranks, ascending and unique; refused unless each holds a target.
  absl::StatusOr<std::vector<int32_t>> SelectTargetRanks(const google::protobuf::RepeatedField<int32_t>& requested);
  absl::Status PrepareAll(const std::string& sync_id, absl::Duration execute_deadline);
  // Rank `rank`'s Prepare: everything but the schedule unless `with_schedule`.
  v1::PrepareRequest PrepareRequestFor(int32_t rank, bool with_schedule, const std::string& sync_id,
                                       absl::Duration execute_deadline, const std::map<int32_t, std::string>& addresses);
  // A fresh communicator id from rank 0 when the last one may be broken.
  absl::Status RenewCommunicator();
  // Every agent holds the schedule and communicator, and agreeing costs them little:
  // the sync may skip Prepare.
  bool OneCallReady();
  // Execute on every rank (each preparing itself with `one_call`); the responses by
  // rank, or the sync refused (every rank stopped before writing) or failed (targets
  // invalid). Requires sync_mu_.
  absl::StatusOr<std::vector<v1::ExecuteResponse>> ExecuteAll(const std::string& sync_id, absl::Duration timeout,
                                                              bool verify, bool one_call);

  const CoordinatorConfig config_;
  const std::string instance_id_;
  RankPool phase_pool_;  // Prepare and Execute fan out on it; used under sync_mu_
  mutable absl::Mutex mu_;
  std::map<int32_t, AgentEntry> agents_ ABSL_GUARDED_BY(mu_);
  std::string local_incarnation_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<AgentLink> local_link_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, v1::PublishRequest> published_ ABSL_GUARDED_BY(mu_);
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string running_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string last_sync_error_ ABSL_GUARDED_BY(mu_);
  bool last_sync_ok_ ABSL_GUARDED_BY(mu_) = false;
  // Ranks a failed sync may have written part of: invalid until a sync writes them.
  std::set<int32_t> invalid_target_ranks_ ABSL_GUARDED_BY(mu_);
  // Ranks whose targets a sync of this coordinator wrote (or tried to) since their last
  // publication; for the others the agent's own word (targets_valid) counts, so a
  // restarted coordinator or agent never calls half-written targets valid.
  std::set<int32_t> synced_target_ranks_ ABSL_GUARDED_BY(mu_);
  // invalid_target_ranks_, and the ranks holding targets whose agent says they are invalid
  // and that no sync of this coordinator wrote since.
  std::set<int32_t> InvalidTargetRanks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Counters {
    int64_t started = 0, succeeded = 0, failed = 0;
    int64_t sent = 0, received = 0, local = 0;  // bytes, successful syncs
  };
  Counters counters_ ABSL_GUARDED_BY(mu_);
  Histogram durations_ ABSL_GUARDED_BY(mu_){{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30}};

  absl::Mutex sync_mu_;  // one sync (or explain) at a time; held before mu_
  // The current epoch's plans by target selection (empty: every target): the full
  // plan and the last partial one.
  std::map<std::vector<int32_t>, CachedPlan> plans_ ABSL_GUARDED_BY(sync_mu_);
  const CachedPlan* plan_ ABSL_GUARDED_BY(sync_mu_) = nullptr;  // the running sync's or explain's
  std::map<int32_t, std::string> delivered_ ABSL_GUARDED_BY(sync_mu_);  // rank -> digest it holds
  // The communicator every agent builds for NCCL: a new id and generation after any
  // failed sync or rejoin (empty ids for host transports).
  std::string communicator_id_ ABSL_GUARDED_BY(sync_mu_);
  int64_t communicator_generation_ ABSL_GUARDED_BY(sync_mu_) = 0;
  bool communicator_valid_ ABSL_GUARDED_BY(mu_) = false;  // Join invalidates it
  int64_t syncs_ ABSL_GUARDED_BY(sync_mu_) = 0;
  // The plan whose schedule every agent holds, with communicator_generation_ built
  // (the last sync ran it and succeeded, nothing planned or renewed since): a sync of
  // that plan is one call per agent. Empty: none.
  std::string ready_digest_ ABSL_GUARDED_BY(sync_mu_);
};

}  // namespace shardsync::coordinator

// shardsync-agent: one per device. Serves local clients (Agent, unix socket) and the
// coordinator and peer agents (AgentControl, TCP). A thin shell: registrations in the
// Registry, schedules decoded by the codec, bytes moved by the executor's RoundEngine.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/agent/coordinator_link.h"
#include "daemon/agent/peer_targets.h"
#include "daemon/agent/registry.h"
#include "daemon/common/schedule_codec.h"
#include "executor/device.h"
#include "executor/mailbox.h"
#include "executor/round_engine.h"
#include "executor/transport.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::agent {

struct AgentConfig {
  int32_t rank = 0;
  std::string device = "cpu";
  absl::Duration rpc_deadline = absl::Seconds(5);
  int64_t max_staging_bytes = int64_t{512} << 20;  // refuse larger budgets at Prepare
  // Who may register sources and targets: the uids of the unix socket's peers; empty:
  // the agent's own uid alone.
  std::vector<uint32_t> source_uids;
  std::vector<uint32_t> target_uids;
};

// The direct path between agents of one node (PrepareRequest.direct_peers). Without
// it an agent refuses a Prepare that names direct peers.
struct DirectPath {
  // Host messages between agents (signal boards on this host, the agents' gRPC channels
  // to others): each stage's completion of the direct copies, and the agreement
  // wherever the data transport has no device collective.
  executor::Transport* signals = nullptr;
  PeerTargets* targets = nullptr;  // maps the peers' targets this rank writes
};

class Agent {
 public:
  // `device` and `transport` are the data path (host memory and the agents' gRPC
  // channels, or a CUDA device and NCCL); `mailbox` takes peers' Transfer calls (host).
  Agent(AgentConfig config, Registry& registry, CoordinatorLink& link, executor::Device& device,
        executor::Transport& transport, executor::Mailbox& mailbox, DirectPath direct = {});

  // Agent service (unix socket).
  // `peer`: the process that called, from the unix socket's credentials. Register is
  // Admit, then the registration held until the client goes away, then Withdraw.
  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest& request,
                        grpc::ServerWriter<v1::RegisterEvent>* writer, const Peer& peer);
  // Takes a registration if `peer` may make it and the registry accepts it.
  absl::Status Admit(const v1::RegisterRequest& request, const Peer& peer);
  // Drops a client's registrations.
  void Withdraw(const std::string& client_id);
  v1::AgentStatus Status() const;
  // Prometheus text: registrations, syncs executed, bytes moved, target validity.
  std::string Metrics() const;

  // AgentControl service (TCP).
  v1::PrepareResponse Prepare(const v1::PrepareRequest& request);
  // Runs the prepared sync (preparing first with request.prepare) once every rank agreed
  // it is ready; with request.verify, adds the checksums of what it read and wrote.
  absl::StatusOr<v1::ExecuteResponse> Execute(const v1::ExecuteRequest& request);
  void Abort(const v1::AbortRequest& request);
  absl::Status Transfer(const v1::TransferRequest& request, absl::Time deadline);
  absl::StatusOr<std::string> NewCommunicatorId() { return transport_.NewCommunicatorId(); }
  // Handles of this rank's targets for a same-node peer that writes them directly.
  // Remembers which registrations it handed out: a sync whose targets were registered
  // again since then is refused instead of letting that peer write the old memory.
  absl::StatusOr<v1::TargetMemoryResponse> TargetMemory(const v1::TargetMemoryRequest& request);
  v1::RankProgress Progress() const;

  // Ends every Register call so the server can shut down.
  void Shutdown() { shutting_down_ = true; }

 private:
  struct Prepared {
    std::shared_ptr<const daemon::LocalSchedule> local;  // shared with a running Execute
    std::string sync_id;
    int64_t staging_bytes = 0;
    absl::Duration deadline;
    executor::PeerSetup peers;
    int64_t checked_version = -1;       // the registry version Check last passed against
    std::vector<int32_t> direct_peers;  // ascending
    // The direct peers' targets this rank writes, by local buffer id - buffer_names.size().
    std::vector<std::shared_ptr<executor::MappedBuffer>> peer_memory;
    bool direct_mapped = false;     // PrepareDirect passed for `direct_peers`
    bool agree_in_execute = false;  // PrepareRequest.agree_in_execute
  };
  // Every buffer the schedule touches, present, of the right role, and in bounds: the
  // mappings in `entries` (by buffer id) where given, else the registry's.
  absl::Status Check(const daemon::LocalSchedule& local,
                     std::vector<std::shared_ptr<const BufferEntry>> entries = {}) const;
  // Keeps (or, cached, finds) the schedule and checks it; a refusal says why. The direct
  // peers' targets are mapped anew (`map_direct`, a Prepare call) or kept from the last
  // Prepare of this schedule (one call: a receiver whose targets changed since votes no).
  absl::Status PrepareLocked(const v1::PrepareRequest& request, bool map_direct, bool* schedule_missing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  executor::PeerSetup PeersOf(const v1::PrepareRequest& request) const;
  // The direct peers of `request`: checked, their targets this rank writes mapped and in
  // bounds, into `prepared`. Every other peer needs the transport: a device transport
  // without a communicator (none asked for) refuses them.
  absl::Status PrepareDirect(const v1::PrepareRequest& request, Prepared& prepared) const;
  // The transport of the rounds (and of the agreement): the data transport, or the
  // direct path's host messages where a device transport builds no communicator.
  executor::Transport& DataTransport(const Prepared& prepared) const;
  // Every direct peer that writes this rank's targets mapped the registrations they have
  // now: else this rank is not ready (the peer would write old memory).
  absl::Status CheckDirectSendersMapped(const Prepared& prepared) const;
  // Execute's stages, in order. Up to SetUpAndAgree nothing is written on this rank.
  // A sync that stops there is refused with FAILED_PRECONDITION naming this rank.
  absl::Status NotStarted(const std::string& sync_id, absl::string_view why) const;
  // The prepared sync the request runs (preparing it first with request.prepare);
  // `ready` gets a failed check, which still takes part in the agreement.
  absl::StatusOr<Prepared> TakePrepared(const v1::ExecuteRequest& request, absl::Status* ready);
  // Holds every buffer's mapping for the run (a client leaving mid-sync cannot unmap
  // it), checks them again if the registry changed, and waits for the sources' writers.
  absl::Status HoldBuffers(const Prepared& prepared, std::vector<std::shared_ptr<const BufferEntry>>& held,
                           executor::BufferTable& table) const;
  // Sets up the transport and, where needed, agrees with every rank that all are ready.
  absl::Status SetUpAndAgree(const v1::ExecuteRequest& request, const Prepared& prepared, const absl::Status& ready,
                             absl::Time deadline);
  // Adds the checksums of what this rank read and wrote to `response`.
  absl::Status Verify(const Prepared& prepared, const executor::BufferTable& table, v1::ExecuteResponse& response);
  // Target validity, counters and the communicator after a run.
  void RecordOutcome(const std::string& sync_id, bool writes_targets,
                     const absl::StatusOr<executor::ExecutionStats>& stats);
  // An Execute that stopped before writing; the transport may have dropped its communicator.
  void Finished(bool communicator_intact);

  const AgentConfig config_;
  Registry& registry_;
  CoordinatorLink& link_;
  executor::Device& device_;
  executor::Transport& transport_;
  executor::Mailbox& mailbox_;
  const DirectPath direct_;
  executor::ExecutionProgress progress_;
  std::atomic<bool> shutting_down_{false};

  mutable absl::Mutex mu_;
  std::map<std::string, Prepared> prepared_ ABSL_GUARDED_BY(mu_);  // by digest
  absl::Mutex execute_mu_;                                         // one sync at a time on this rank
  std::string last_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string running_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string aborted_sync_id_ ABSL_GUARDED_BY(mu_);    // an Abort that came before its Execute
  std::string writing_sync_id_ ABSL_GUARDED_BY(mu_);    // past the agreement: writing targets
  int64_t built_generation_ ABSL_GUARDED_BY(mu_) = -1;  // of the communicator the transport holds
  // Its targets hold a completed sync's bytes: not at start, nor after a target is
  // registered or a sync stopped part way, until a sync writes them (the link is told).
  bool target_valid_ ABSL_GUARDED_BY(mu_) = false;
  int64_t executed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  executor::ExecutionStats moved_ ABSL_GUARDED_BY(mu_);  // totals of successful syncs
  // TargetMemory answers never wait for mu_ (a peer asks while this agent prepares).
  mutable absl::Mutex handed_mu_;
  // By peer: the buffers it was last handed, each with its registration's version.
  std::map<int32_t, std::vector<std::pair<std::string, int64_t>>> handed_ ABSL_GUARDED_BY(handed_mu_);
};

}  // namespace shardsync::agent

// The sync desk: the coordinator's and the peers' calls about syncs (AgentControl's
// Prepare, Execute, Abort, Transfer, Progress, NewCommunicatorId). Prepares through the
// Preparer (no lock held while it asks direct peers for their targets), keeps what it
// prepared in the SyncLedger, and runs one sync at a time on this rank with the
// executor's RoundEngine. Its one lock only orders Executes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/agent/peer_desk.h"
#include "daemon/agent/preparer.h"
#include "daemon/agent/registry.h"
#include "daemon/agent/sync_ledger.h"
#include "executor/device.h"
#include "executor/mailbox.h"
#include "executor/round_engine.h"
#include "executor/transport.h"
#include "proto/shardsync.pb.h"

namespace shardsync::agent {

// What the desk works with; every part outlives it.
struct SyncParts {
  Registry& registry;
  SyncLedger& ledger;
  const Preparer& preparer;
  const PeerDesk& peers;
  executor::Device& device;
  executor::Transport& transport;  // the data transport: host channels, or NCCL
  executor::Mailbox& mailbox;      // takes peers' Transfer calls (host transport)
  DirectPath direct;
};

class SyncDesk {
 public:
  // `snapshot_bytes`: the budget of what this rank keeps of its sent chunks (delta sync).
  SyncDesk(int32_t rank, absl::Duration rpc_deadline, int64_t snapshot_bytes, SyncParts parts)
      : rank_(rank), rpc_deadline_(rpc_deadline), parts_(parts), snapshots_(snapshot_bytes) {}

  // Checks and keeps the schedule; a refusal says why (schedule_missing: the request
  // renews a schedule this rank does not hold).
  v1::PrepareResponse Prepare(const v1::PrepareRequest& request);
  // Runs the prepared sync (preparing first with request.prepare) once every rank agreed
  // it is ready; with request.verify, adds the checksums of what it read and wrote.
  // Up to the agreement nothing is written on this rank, and a sync that stops there is
  // refused with FAILED_PRECONDITION naming this rank; after it, never that code.
  absl::StatusOr<v1::ExecuteResponse> Execute(const v1::ExecuteRequest& request);
  void Abort(const v1::AbortRequest& request);
  // A peer's chunk (host transport), held only for a sync this rank prepared and no
  // longer than that sync may run.
  absl::Status Transfer(const v1::TransferRequest& request, absl::Time deadline);
  absl::StatusOr<std::string> NewCommunicatorId() { return parts_.transport.NewCommunicatorId(); }
  v1::RankProgress Progress() const;

 private:
  absl::Status NotStarted(const std::string& sync_id, absl::string_view why) const;
  // The prepared sync the request runs (renewing it first with request.prepare);
  // `ready` gets a failed check, which still takes part in the agreement.
  absl::StatusOr<PreparedSync> TakePrepared(const v1::ExecuteRequest& request, absl::Status* ready);
  // Holds every buffer's mapping for the run (a client leaving mid-sync cannot unmap
  // it), checks them again if the registry changed, and waits for the sources' writers.
  absl::Status HoldBuffers(const PreparedSync& prepared, std::vector<std::shared_ptr<const BufferEntry>>& held,
                           executor::BufferTable& table) const;
  // Every mapping the run touches still shows its memory (no client shrank it): checked
  // before the run and after it, naming the buffer.
  absl::Status CheckMappings(const PreparedSync& prepared,
                             const std::vector<std::shared_ptr<const BufferEntry>>& held) const;
  // Sets up the transport and, where needed, agrees with every rank that all are ready.
  absl::Status SetUpAndAgree(const v1::ExecuteRequest& request, const PreparedSync& prepared, const absl::Status& ready,
                             absl::Time deadline);
  // The transport of the rounds (and of the agreement): the data transport, or the
  // direct path's host messages where a device transport builds no communicator.
  executor::Transport& DataTransport(const PreparedSync& prepared) const;
  // Adds the checksums of what this rank read and wrote to `response`.
  absl::Status Verify(const PreparedSync& prepared, const executor::BufferTable& table,
                      v1::ExecuteResponse& response) const;

  const int32_t rank_;
  const absl::Duration rpc_deadline_;
  const SyncParts parts_;
  executor::ExecutionProgress progress_;
  absl::Mutex execute_mu_;  // one sync at a time on this rank
  executor::DeltaSnapshots snapshots_ ABSL_GUARDED_BY(execute_mu_);
};

}  // namespace shardsync::agent

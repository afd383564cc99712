#include "daemon/agent/sync_desk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/agent/peer_targets.h"
#include "daemon/common/rank_stats.h"
#include "executor/verify.h"
#include "planner/quantize.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {
namespace {

// Whether this rank's part of `schedule` writes any of its targets (a partial sync may
// only read here: its targets then keep their bytes and validity).
bool WritesTargets(const planner::Schedule& schedule) {
  return !schedule.fills.empty() ||
         std::any_of(schedule.stages.begin(), schedule.stages.end(), [](const planner::Stage& stage) {
           return !stage.local_segments.empty() || !stage.receives.empty();
         });
}

// From here on bytes were written: never answer FAILED_PRECONDITION (see the proto).
absl::Status AfterWriting(const absl::Status& status) {
  return absl::IsFailedPrecondition(status) ? absl::InternalError(status.message()) : status;
}

}  // namespace

v1::PrepareResponse SyncDesk::Prepare(const v1::PrepareRequest& request) {
  const int64_t ticket = parts_.ledger.TakeTicket();
  absl::Status status;
  bool schedule_missing = false;
  bool kept = true;
  if (request.schedule_cached()) {
    std::optional<PreparedSync> held = parts_.ledger.Find(request.digest());
    schedule_missing = !held;
    if (held) {
      status = parts_.preparer.Renew(request, /*map_direct=*/true, *held);
      kept = parts_.ledger.Renewed(request.digest(), *std::move(held), ticket);
    }
  } else {
    absl::StatusOr<PreparedSync> prepared = parts_.preparer.Prepare(request);
    status = prepared.status();
    if (prepared.ok()) kept = parts_.ledger.Keep(request.digest(), *std::move(prepared), ticket);
  }
  const bool peer_refused = status.GetPayload(kPeerRefusedPayload).has_value();
  if (status.ok() && !kept) {
    status =
        absl::AbortedError(absl::StrCat("sync ", request.sync_id(), " was prepared again since this Prepare came"));
  }
  v1::PrepareResponse response;
  response.set_ok(status.ok() && !schedule_missing);
  response.set_schedule_missing(schedule_missing);
  response.set_peer_refused(peer_refused);
  if (!status.ok()) {
    response.set_refusal(std::string(status.message()));
    spdlog::warn("refusing sync {}: {}", request.sync_id(), std::string(status.message()));
  }
  return response;
}

absl::Status SyncDesk::NotStarted(const std::string& sync_id, absl::string_view why) const {
  spdlog::warn("sync {} stops before writing on rank {}: {}", sync_id, rank_, std::string(why));
  return absl::FailedPreconditionError(absl::StrCat("no byte moved on rank ", rank_, ": ", why));
}

absl::StatusOr<PreparedSync> SyncDesk::TakePrepared(const v1::ExecuteRequest& request, absl::Status* ready) {
  if (request.has_prepare()) {
    const v1::PrepareRequest& prepare = request.prepare();
    // Without its communicator or schedule a rank cannot take part in the agreement;
    // it answers at once and the coordinator aborts the ranks waiting in it.
    if (!parts_.ledger.Built(prepare.communicator_generation())) {
      parts_.preparer.Refused(request.sync_id());
      return NotStarted(request.sync_id(), absl::StrCat("communicator generation ", prepare.communicator_generation(),
                                                        " is not built here"));
    }
    const int64_t ticket = parts_.ledger.TakeTicket();
    if (prepare.schedule_cached()) {
      std::optional<PreparedSync> held = parts_.ledger.Find(prepare.digest());
      if (!held) {
        parts_.preparer.Refused(request.sync_id());
        return NotStarted(request.sync_id(),
                          absl::StrCat("rank ", rank_, " does not hold the schedule of plan ", prepare.digest()));
      }
      *ready = parts_.preparer.Renew(prepare, /*map_direct=*/false, *held);
      parts_.ledger.Renewed(prepare.digest(), *std::move(held), ticket);
    } else {
      absl::StatusOr<PreparedSync> prepared = parts_.preparer.Prepare(prepare);
      *ready = prepared.status();
      if (prepared.ok()) parts_.ledger.Keep(prepare.digest(), *std::move(prepared), ticket);
    }
  }
  absl::StatusOr<PreparedSync> started = parts_.ledger.Start(request.digest(), request.sync_id());
  if (!started.ok()) {
    // A request.prepare refused before it could name this sync: its refusal says why.
    const bool unnamed = absl::IsNotFound(started.status()) && !ready->ok();
    return NotStarted(request.sync_id(), unnamed ? ready->message() : started.status().message());
  }
  return started;
}

absl::Status SyncDesk::HoldBuffers(const PreparedSync& prepared, std::vector<std::shared_ptr<const BufferEntry>>& held,
                                   executor::BufferTable& table) const {
  const daemon::LocalSchedule& local = *prepared.local;
  held.assign(local.buffer_names.size(), nullptr);
  table.assign(local.buffer_count(), nullptr);
  for (size_t k = 0; k < prepared.peer_memory.size(); ++k) {
    const std::shared_ptr<executor::MappedBuffer>& peer = prepared.peer_memory[k];
    if (peer) table[held.size() + k] = peer->data();
  }
  for (size_t id = 0; id < held.size(); ++id) {
    const std::string& name = local.buffer_names[id];
    held[id] = parts_.registry.Find(name);
    if (!held[id]) return absl::FailedPreconditionError(absl::StrCat("buffer '", name, "' is no longer registered"));
    table[id] = held[id]->memory->data();
    // The scratch changes size without a new registry version (a peer may ask for the
    // next plan's first): this plan's must be the one held.
    if (name == planner::kScratchBufferName && held[id]->memory->bytes() != local.scratch_bytes) {
      return absl::FailedPreconditionError(absl::StrCat("the scratch holds ", held[id]->memory->bytes(),
                                                        " bytes; this plan's is ", local.scratch_bytes));
    }
  }
  SHARDSYNC_RETURN_IF_ERROR(CheckMappings(prepared, held));
  // The registry changed since the check: check the mappings held instead.
  if (parts_.registry.version() != prepared.checked_version) {
    SHARDSYNC_RETURN_IF_ERROR(parts_.preparer.CheckBuffers(local, held));
  }
  // Sources written by the device's other processes: read them after the writes.
  return parts_.device.WaitFor(parts_.registry.ReadyEvents());
}

absl::Status SyncDesk::CheckMappings(const PreparedSync& prepared,
                                     const std::vector<std::shared_ptr<const BufferEntry>>& held) const {
  const daemon::LocalSchedule& local = *prepared.local;
  for (size_t id = 0; id < held.size(); ++id) {
    if (const absl::Status intact = held[id]->memory->CheckIntact(); !intact.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("buffer '", local.buffer_names[id], "': ", intact.message()));
    }
  }
  // A peer's client can shrink its shared memory too.
  for (size_t k = 0; k < prepared.peer_memory.size(); ++k) {
    const std::shared_ptr<executor::MappedBuffer>& peer = prepared.peer_memory[k];
    if (!peer) continue;
    if (const absl::Status intact = peer->CheckIntact(); !intact.ok()) {
      const daemon::PeerBufferName& name = local.peer_buffers[k];
      return absl::FailedPreconditionError(
          absl::StrCat("buffer '", name.name, "' of rank ", name.rank, ": ", intact.message()));
    }
  }
  return absl::OkStatus();
}

executor::Transport& SyncDesk::DataTransport(const PreparedSync& prepared) const {
  // A device transport with no communicator asked for: every peer is direct.
  const bool without_communicator = parts_.transport.device_memory() && prepared.peers.communicator_id.empty();
  return without_communicator && parts_.direct.signals != nullptr ? *parts_.direct.signals : parts_.transport;
}

absl::Status SyncDesk::SetUpAndAgree(const v1::ExecuteRequest& request, const PreparedSync& prepared,
                                     const absl::Status& ready, absl::Time deadline) {
  executor::Transport& data = DataTransport(prepared);
  executor::Transport* signals = parts_.direct.signals;
  std::vector<executor::Transport*> transports = {&data};
  if (signals != nullptr && signals != &data) transports.push_back(signals);
  for (executor::Transport* transport : transports) {
    if (const absl::Status setup = transport->Setup(prepared.peers, deadline); !setup.ok()) {
      parts_.ledger.Stopped(/*communicator_intact=*/false);
      return NotStarted(request.sync_id(), setup.message());
    }
  }
  parts_.ledger.SetBuilt(prepared.peers.generation);
  // One call (request.prepare) needs the agreement, and so does a world where peers
  // write each other's targets; after a Prepare fan-out it closes the gap between
  // Prepare and Execute where it is cheap.
  // Without a device collective the ranks agree over host messages: the signal boards
  // of the agents of this host, the agents' channels for the others.
  if (prepared.peers.world_size > 1 && (request.has_prepare() || prepared.agree_in_execute || data.fast_agreement())) {
    executor::Transport& agreement = data.fast_agreement() || signals == nullptr ? data : *signals;
    const absl::StatusOr<bool> all_ready = agreement.Agree(request.sync_id(), prepared.peers, ready.ok(), deadline);
    if (!all_ready.ok()) {
      parts_.ledger.Stopped(/*communicator_intact=*/false);
      return NotStarted(request.sync_id(),
                        absl::StrCat("agreeing with the other ranks: ", all_ready.status().message()));
    }
    if (ready.ok() && !*all_ready) {
      parts_.ledger.Stopped(/*communicator_intact=*/true);
      return NotStarted(request.sync_id(), "another rank was not ready");
    }
  }
  if (!ready.ok()) {
    parts_.ledger.Stopped(/*communicator_intact=*/true);
    return NotStarted(request.sync_id(), ready.message());
  }
  return absl::OkStatus();
}

absl::Status SyncDesk::Verify(const PreparedSync& prepared, const executor::BufferTable& table,
                              v1::ExecuteResponse& response) const {
  const absl::Time start = absl::Now();
  SHARDSYNC_ASSIGN_OR_RETURN(const executor::Checksums sums,
                             executor::ComputeChecksums(parts_.device, prepared.local->plan, prepared.local->schedule,
                                                        table, prepared.staging_bytes));
  for (const auto& [key, side] : sums) {
    v1::TensorChecksum* checksum = response.add_checksums();
    checksum->set_tensor(key.first);
    checksum->set_target_rank(key.second);
    checksum->set_sources(side.sources);
    checksum->set_targets(side.targets);
  }
  response.mutable_stats()->set_verify_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::StatusOr<v1::ExecuteResponse> SyncDesk::Execute(const v1::ExecuteRequest& request) {
  daemon::ExecuteTimes times;
  times.entered = absl::Now();
  absl::MutexLock execute_lock(&execute_mu_);
  // Reset before TakePrepared's abort check: Abort marks the sync before it aborts the
  // transport, so an Abort is either seen there or reaches the transport after this.
  parts_.transport.Reset();
  if (parts_.direct.signals != nullptr && parts_.direct.signals != &parts_.transport) parts_.direct.signals->Reset();
  absl::Status ready = absl::OkStatus();  // this rank's vote: every check passed
  SHARDSYNC_ASSIGN_OR_RETURN(PreparedSync prepared, TakePrepared(request, &ready));
  // Hold every mapping for the whole run: a client leaving mid-sync cannot unmap it.
  std::vector<std::shared_ptr<const BufferEntry>> held;
  executor::BufferTable table;
  if (ready.ok()) ready = HoldBuffers(prepared, held, table);
  if (ready.ok()) ready = parts_.peers.CheckSendersMapped(prepared);
  if (ready.ok() && request.has_delta() && DataTransport(prepared).device_memory()) {
    ready = absl::FailedPreconditionError("delta sync runs on host transports; this agent's is a device's");
  }
  times.checked = absl::Now();
  const absl::Time deadline = times.checked + prepared.deadline;
  SHARDSYNC_RETURN_IF_ERROR(SetUpAndAgree(request, prepared, ready, deadline));
  times.agreed = absl::Now();

  const daemon::LocalSchedule& local = *prepared.local;
  const bool writes_targets = WritesTargets(local.schedule);
  if (writes_targets) parts_.ledger.MarkWriting(request.sync_id());
  executor::RoundEngine engine(parts_.device, DataTransport(prepared));
  executor::RunInputs run{request.sync_id(),
                          local.plan,
                          local.schedule,
                          table,
                          prepared.staging_bytes,
                          deadline,
                          &progress_,
                          executor::DirectLinks{prepared.direct_peers, parts_.direct.signals}};
  executor::DeltaRun delta;
  if (request.has_delta()) {
    delta.digest = request.digest();
    delta.peer_versions.insert(request.delta().peer_versions().begin(), request.delta().peer_versions().end());
    delta.full_peers.insert(request.delta().full_peers().begin(), request.delta().full_peers().end());
    delta.senders.insert(request.delta().delta_senders().begin(), request.delta().delta_senders().end());
    delta.snapshots = &snapshots_;
    run.delta = &delta;
  }
  const absl::StatusOr<executor::ExecutionStats> stats = engine.Run(run);
  v1::ExecuteResponse response;
  const absl::Status verified = stats.ok() && request.verify() ? Verify(prepared, table, response) : absl::OkStatus();
  // Memory shrunk under the run read as zeros or took writes that are lost.
  const absl::Status intact = CheckMappings(prepared, held);
  parts_.ledger.Ran(request.sync_id(), writes_targets,
                    intact.ok() ? stats : absl::StatusOr<executor::ExecutionStats>(intact));
  if (!stats.ok()) return AfterWriting(stats.status());  // the coordinator names the rank
  if (!intact.ok()) return AfterWriting(intact);
  if (!verified.ok()) return AfterWriting(verified);
  times.finished = absl::Now();
  response.mutable_stats()->MergeFrom(
      daemon::RankStatsOf(rank_, *stats, local.scratch_bytes, times));  // beside verify_seconds
  if (!request.links()) response.mutable_stats()->clear_peer_wire();    // a link per peer: only when asked
  return response;
}

void SyncDesk::Abort(const v1::AbortRequest& request) {
  spdlog::warn("aborting sync {}: {}", request.sync_id(), request.reason());
  parts_.ledger.Aborted(request.sync_id());
  const std::string reason = absl::StrCat("sync ", request.sync_id(), " aborted: ", request.reason());
  parts_.transport.Abort(request.sync_id(), reason);
  executor::Transport* signals = parts_.direct.signals;
  if (signals != nullptr && signals != &parts_.transport) signals->Abort(request.sync_id(), reason);
}

absl::Status SyncDesk::Transfer(const v1::TransferRequest& request, absl::Time deadline) {
  // Only a chunk of the sync this agent prepared is held (until its receive is posted),
  // and no longer than that sync may run: nobody parks memory here. A sync that prepares
  // in its Execute call (one call) may hear a peer's one-byte vote first: that alone
  // waits for it, at most an RPC deadline.
  const bool vote = request.round() == executor::kAgreementRound && request.data().size() == 1;
  SHARDSYNC_ASSIGN_OR_RETURN(
      const absl::Duration sync_deadline,
      vote ? parts_.ledger.AwaitPrepared(request.sync_id(), std::min(deadline, absl::Now() + rpc_deadline_))
           : parts_.ledger.DeadlineOf(request.sync_id()));
  deadline = std::min(deadline, absl::Now() + sync_deadline);
  const std::string& data = request.data();
  const executor::Mailbox::Piece piece{reinterpret_cast<const uint8_t*>(data.data()),
                                       static_cast<int64_t>(data.size()),
                                       request.offset(),
                                       request.span_bytes(),
                                       request.chunk_bytes(),
                                       request.delta()};
  return parts_.mailbox.Deliver(request.sync_id(), request.from_rank(), request.round(), piece, deadline);
}

v1::RankProgress SyncDesk::Progress() const {
  v1::RankProgress progress;
  progress.set_rank(rank_);
  progress.set_sync_id(parts_.ledger.running_sync_id());
  progress.set_bytes_done(progress_.bytes_done);
  progress.set_bytes_total(progress_.bytes_total);
  progress.set_rounds_done(progress_.rounds_done);
  progress.set_rounds_total(progress_.rounds_total);
  return progress;
}

}  // namespace shardsync::agent

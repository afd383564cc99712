// What this rank knows of its syncs, under one lock: the schedule of the current plan
// (by its digest), which sync runs, was aborted or writes targets now, the communicator
// generation the transport holds, whether the targets hold a completed sync's bytes,
// and the totals. Nothing here calls another process: every method returns at once,
// but for AwaitPrepared, which waits on this ledger alone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/agent/coordinator_link.h"
#include "daemon/common/schedule_codec.h"
#include "executor/memory.h"
#include "executor/round_engine.h"
#include "executor/transport.h"

namespace shardsync::agent {

// A sync this rank may run: its schedule and what the schedule was checked against.
// Copied out of and into the ledger whole (the schedule and the mappings are shared).
// What one sync has each direct peer write on this rank.
struct PlannedWriters {
  std::map<int32_t, std::set<std::string>> buffers;  // by peer: this rank's buffers it writes
  int64_t scratch_bytes = 0;                         // this rank's scratch in the plan
  bool refused = false;                              // this rank refused the sync: none may map
};

struct PreparedSync {
  std::shared_ptr<const daemon::LocalSchedule> local;  // shared with a running Execute
  std::string sync_id;
  int64_t staging_bytes = 0;
  absl::Duration deadline;
  executor::PeerSetup peers;
  bool agree_in_execute = false;      // PrepareRequest.agree_in_execute
  int64_t checked_version = -1;       // the registry version the buffer check last passed against
  std::vector<int32_t> direct_peers;  // ascending
  // The direct peers' targets this rank writes, by local buffer id - buffer_names.size().
  std::vector<std::shared_ptr<executor::MappedBuffer>> peer_memory;
  bool direct_mapped = false;  // peer_memory holds the targets of `direct_peers`
  PlannedWriters writers;      // of this rank's targets, by `direct_peers`
};

class SyncLedger {
 public:
  // `link` is told whenever target validity changes.
  SyncLedger(int32_t rank, CoordinatorLink& link) : rank_(rank), link_(link) {}

  // The prepared sync of plan `digest`, if this rank holds it.
  std::optional<PreparedSync> Find(const std::string& digest) const;
  // Prepares run beside each other (a slow direct peer keeps one waiting): each takes a
  // ticket as it starts, and what it keeps is dropped if a later one kept first.
  int64_t TakeTicket();
  // Keeps `prepared` as the sync of a new plan `digest`, dropping every other one (one
  // plan per layout epoch); false if a Prepare with a later ticket kept first.
  bool Keep(const std::string& digest, PreparedSync prepared, int64_t ticket);
  // `prepared`, renewed, replaces the sync of plan `digest` if this rank still holds it;
  // false if a Prepare with a later ticket kept first.
  bool Renewed(const std::string& digest, PreparedSync prepared, int64_t ticket);

  // Execute's start: the prepared sync `sync_id` of plan `digest`, now running; else
  // NOT_FOUND (not prepared) or ABORTED (aborted before it started).
  absl::StatusOr<PreparedSync> Start(const std::string& digest, const std::string& sync_id);
  // Whether the transport holds the communicator of `generation`.
  bool Built(int64_t generation) const;
  void SetBuilt(int64_t generation);
  // The running sync now writes this rank's targets.
  void MarkWriting(const std::string& sync_id);
  // The running sync stopped before writing; the transport may have dropped its
  // communicator.
  void Stopped(bool communicator_intact);
  // The running sync ran: validity (if it writes targets), totals, the communicator.
  void Ran(const std::string& sync_id, bool writes_targets, const absl::StatusOr<executor::ExecutionStats>& stats);
  // The coordinator aborted `sync_id`: an Execute that comes later stops at once, and
  // targets it was writing are invalid.
  void Aborted(const std::string& sync_id);
  // A target was registered: new memory holds no sync's bytes yet.
  void TargetsChanged();

  // Waits until `sync_id` is prepared (or aborted) or `deadline`; then the prepared
  // sync's deadline, or FAILED_PRECONDITION naming the sync.
  absl::StatusOr<absl::Duration> AwaitPrepared(const std::string& sync_id, absl::Time deadline) const;
  // The sync's deadline if `sync_id` is prepared, else FAILED_PRECONDITION naming it.
  absl::StatusOr<absl::Duration> DeadlineOf(const std::string& sync_id) const;

  std::string running_sync_id() const;
  std::string last_sync_id() const;
  // The sync whose bytes this rank's targets hold; empty while they hold none's.
  std::string target_version() const;
  // Prometheus text: syncs executed and failed, bytes moved, target validity.
  void AppendMetrics(std::string* out) const;

 private:
  bool PreparedLocked(const std::string& sync_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetTargetVersionLocked(const std::string& version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int32_t rank_;
  CoordinatorLink& link_;
  mutable absl::Mutex mu_;
  std::map<std::string, PreparedSync> prepared_ ABSL_GUARDED_BY(mu_);  // by digest
  int64_t tickets_ ABSL_GUARDED_BY(mu_) = 0;                           // taken
  int64_t kept_ticket_ ABSL_GUARDED_BY(mu_) = 0;                       // of what prepared_ holds
  std::string last_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string running_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string aborted_sync_id_ ABSL_GUARDED_BY(mu_);  // an Abort that came before its Execute
  std::string writing_sync_id_ ABSL_GUARDED_BY(mu_);  // past the agreement: writing targets
  int64_t built_generation_ ABSL_GUARDED_BY(mu_) = -1;
  // The sync whose bytes its targets hold (they are valid): none at start, nor after a
  // target is registered or a sync stopped part way, until a sync writes them.
  std::string target_version_ ABSL_GUARDED_BY(mu_);
  int64_t executed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  executor::ExecutionStats moved_ ABSL_GUARDED_BY(mu_);  // totals of successful syncs
};

}  // namespace shardsync::agent

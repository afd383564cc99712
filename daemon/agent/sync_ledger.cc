#include "daemon/agent/sync_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/metrics_http.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {

std::optional<PreparedSync> SyncLedger::Find(const std::string& digest) const {
  absl::MutexLock lock(&mu_);
  const auto it = prepared_.find(digest);
  if (it == prepared_.end()) return std::nullopt;
  return it->second;
}

int64_t SyncLedger::TakeTicket() {
  absl::MutexLock lock(&mu_);
  return ++tickets_;
}

bool SyncLedger::Keep(const std::string& digest, PreparedSync prepared, int64_t ticket) {
  absl::MutexLock lock(&mu_);
  if (ticket < kept_ticket_) return false;
  kept_ticket_ = ticket;
  prepared_.clear();
  prepared_[digest] = std::move(prepared);
  return true;
}

bool SyncLedger::Renewed(const std::string& digest, PreparedSync prepared, int64_t ticket) {
  absl::MutexLock lock(&mu_);
  if (ticket < kept_ticket_) return false;
  const auto it = prepared_.find(digest);
  if (it == prepared_.end()) return false;
  kept_ticket_ = ticket;
  it->second = std::move(prepared);
  return true;
}

absl::StatusOr<PreparedSync> SyncLedger::Start(const std::string& digest, const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  const auto it = prepared_.find(digest);
  if (it == prepared_.end() || it->second.sync_id != sync_id) {
    return absl::NotFoundError(absl::StrCat("sync ", sync_id, " was not prepared"));
  }
  if (aborted_sync_id_ == sync_id) return absl::AbortedError("the sync was aborted before it started");
  last_sync_id_ = sync_id;
  running_sync_id_ = sync_id;
  return it->second;
}

bool SyncLedger::Built(int64_t generation) const {
  absl::MutexLock lock(&mu_);
  return built_generation_ == generation;
}

void SyncLedger::SetBuilt(int64_t generation) {
  absl::MutexLock lock(&mu_);
  built_generation_ = generation;
}

void SyncLedger::MarkWriting(const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  writing_sync_id_ = sync_id;
}

void SyncLedger::Stopped(bool communicator_intact) {
  absl::MutexLock lock(&mu_);
  running_sync_id_.clear();
  if (!communicator_intact) built_generation_ = -1;
}

void SyncLedger::Ran(const std::string& sync_id, bool writes_targets,
                     const absl::StatusOr<executor::ExecutionStats>& stats) {
  absl::MutexLock lock(&mu_);
  running_sync_id_.clear();
  writing_sync_id_.clear();
  if (writes_targets) SetTargetVersionLocked(stats.ok() ? sync_id : "");
  ++(stats.ok() ? executed_ : failed_);
  if (!stats.ok()) {
    built_generation_ = -1;  // the communicator may be aborted: the coordinator renews it
    spdlog::error("sync {} failed on rank {}: {}", sync_id, rank_, std::string(stats.status().message()));
    return;
  }
  moved_.sent_bytes += stats->sent_bytes;
  moved_.received_bytes += stats->received_bytes;
  moved_.local_bytes += stats->local_bytes;
}

void SyncLedger::Aborted(const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  aborted_sync_id_ = sync_id;
  if (writing_sync_id_ == sync_id) SetTargetVersionLocked("");  // stopped part way
}

void SyncLedger::TargetsChanged() {
  absl::MutexLock lock(&mu_);
  SetTargetVersionLocked("");
}

bool SyncLedger::PreparedLocked(const std::string& sync_id) const {
  return std::any_of(prepared_.begin(), prepared_.end(),
                     [&](const auto& entry) { return entry.second.sync_id == sync_id; });
}

absl::StatusOr<absl::Duration> SyncLedger::AwaitPrepared(const std::string& sync_id, absl::Time deadline) const {
  {
    absl::MutexLock lock(&mu_);
    const auto known = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return PreparedLocked(sync_id) || aborted_sync_id_ == sync_id;
    };
    mu_.AwaitWithDeadline(absl::Condition(&known), deadline);
  }
  return DeadlineOf(sync_id);
}

absl::StatusOr<absl::Duration> SyncLedger::DeadlineOf(const std::string& sync_id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [digest, prepared] : prepared_) {
    if (prepared.sync_id == sync_id) return prepared.deadline;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank_, " has prepared no sync '", sync_id, "': a chunk for it is refused"));
}

std::string SyncLedger::running_sync_id() const {
  absl::MutexLock lock(&mu_);
  return running_sync_id_;
}

std::string SyncLedger::last_sync_id() const {
  absl::MutexLock lock(&mu_);
  return last_sync_id_;
}

std::string SyncLedger::target_version() const {
  absl::MutexLock lock(&mu_);
  return target_version_;
}

void SyncLedger::AppendMetrics(std::string* out) const {
  absl::MutexLock lock(&mu_);
  AppendMetric(out, "shardsync_agent_syncs_executed_total", "counter", "Syncs this rank finished.", executed_);
  AppendMetric(out, "shardsync_agent_syncs_failed_total", "counter", "Syncs that failed on this rank.", failed_);
  AppendMetric(out, "shardsync_agent_sent_bytes_total", "counter", "Bytes this rank sent.", moved_.sent_bytes);
  AppendMetric(out, "shardsync_agent_received_bytes_total", "counter", "Bytes this rank received.",
               moved_.received_bytes);
  AppendMetric(out, "shardsync_agent_local_bytes_total", "counter", "Bytes this rank copied locally.",
               moved_.local_bytes);
  AppendMetric(out, "shardsync_agent_target_valid", "gauge",
               "1 unless a sync failed part way through this rank's targets.", !target_version_.empty());
}

void SyncLedger::SetTargetVersionLocked(const std::string& version) {
  target_version_ = version;
  link_.SetTargetVersion(version);  // in process: it only notes the value for the next Publish
}

}  // namespace shardsync::agent

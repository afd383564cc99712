#include "daemon/coordinator/sync_record.h"

#include "spdlog/spdlog.h"

namespace shardsync::coordinator {

void SyncRecord::Started(const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  ++started_;
  running_sync_id_ = sync_id;
}

void SyncRecord::Finished(const std::string& sync_id, const absl::Status& status, double seconds) {
  absl::MutexLock lock(&mu_);
  ++(status.ok() ? succeeded_ : failed_);
  running_sync_id_.clear();
  if (status.ok()) durations_.Observe(seconds);
  last_sync_id_ = sync_id;
  last_sync_ok_ = status.ok();
  last_sync_error_ = std::string(status.message());
  if (!status.ok()) spdlog::warn("{} failed: {}", sync_id, last_sync_error_);
}

void SyncRecord::AddMoved(const v1::SyncResponse& response) {
  absl::MutexLock lock(&mu_);
  for (const v1::RankStats& r : response.ranks()) {
    sent_ += r.sent_bytes();
    received_ += r.received_bytes();
    local_ += r.local_bytes();
  }
}

void SyncRecord::FillStatus(v1::CoordinatorStatus* status) const {
  absl::MutexLock lock(&mu_);
  if (!running_sync_id_.empty()) status->set_running_sync_id(running_sync_id_);
  status->set_last_sync_id(last_sync_id_);
  status->set_last_sync_ok(last_sync_ok_);
  status->set_last_sync_error(last_sync_error_);
}

void SyncRecord::AppendMetrics(std::string* out) const {
  absl::MutexLock lock(&mu_);
  AppendMetric(out, "shardsync_syncs_started_total", "counter", "Syncs asked for.", started_);
  AppendMetric(out, "shardsync_syncs_succeeded_total", "counter", "Syncs every agent finished.", succeeded_);
  AppendMetric(out, "shardsync_syncs_failed_total", "counter", "Syncs refused or failed.", failed_);
  AppendMetric(out, "shardsync_sent_bytes_total", "counter", "Bytes sent between agents by successful syncs.", sent_);
  AppendMetric(out, "shardsync_received_bytes_total", "counter", "Bytes received by agents in successful syncs.",
               received_);
  AppendMetric(out, "shardsync_local_bytes_total", "counter", "Bytes copied on one agent in successful syncs.", local_);
  durations_.Append(out, "shardsync_sync_duration_seconds", "Wall time of successful syncs.");
  AppendMetric(out, "shardsync_last_sync_version", "gauge", "Number of the last successful sync (0: none).",
               succeeded_);
}

}  // namespace shardsync::coordinator

#include "daemon/coordinator/sync_record.h"

#include "absl/strings/str_cat.h"
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
    wire_ += r.wire_bytes();
    staged_ += r.staged_sent_bytes();
    delta_chunks_ += r.delta_chunks();
    changed_words_ += r.changed_words();
    encode_seconds_ += r.encode_seconds();
    apply_seconds_ += r.apply_seconds();
    for (const auto& [why, chunks] : r.full_chunks()) full_chunks_[why] += chunks;
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
  AppendMetric(out, "shardsync_wire_bytes_total", "counter",
               "Bytes staged links carried in successful syncs, deltas encoded.", wire_);
  AppendMetric(out, "shardsync_staged_bytes_total", "counter",
               "Bytes of the chunks staged links carried in successful syncs, whole (a full sync's wire bytes).",
               staged_);
  AppendMetric(out, "shardsync_delta_chunks_total", "counter", "Chunks sent as deltas in successful syncs.",
               delta_chunks_);
  AppendMetric(out, "shardsync_changed_words_total", "counter",
               "16-bit words that changed in the chunks sent as deltas.", changed_words_);
  AppendMetric(out, "shardsync_delta_encode_seconds_total", "counter",
               "Time the ranks spent diffing chunks against their snapshots.", encode_seconds_);
  AppendMetric(out, "shardsync_delta_apply_seconds_total", "counter",
               "Time the ranks spent applying the deltas they received.", apply_seconds_);
  absl::StrAppend(out,
                  "# HELP shardsync_full_chunks_total Chunks of delta links sent whole in successful syncs, by why.\n"
                  "# TYPE shardsync_full_chunks_total counter\n");
  for (const auto& [why, chunks] : full_chunks_) {
    absl::StrAppend(out, "shardsync_full_chunks_total{reason=\"", why, "\"} ", chunks, "\n");
  }
}

}  // namespace shardsync::coordinator

// What the coordinator reports of its syncs, also while one runs: the running sync, the
// last one's outcome, counters, bytes moved and durations. One lock, held only over
// this record; nothing here calls another process.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics_http.h"
#include "proto/shardsync.pb.h"

namespace shardsync::coordinator {

class SyncRecord {
 public:
  void Started(const std::string& sync_id);
  // The sync ended with `status`; `seconds` counts only for a success.
  void Finished(const std::string& sync_id, const absl::Status& status, double seconds);
  // The bytes of a successful sync's ranks.
  void AddMoved(const v1::SyncResponse& response);
  // running_sync_id (if any) and the last sync's id, outcome and error.
  void FillStatus(v1::CoordinatorStatus* status) const;
  void AppendMetrics(std::string* out) const;

 private:
  mutable absl::Mutex mu_;
  std::string running_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string last_sync_id_ ABSL_GUARDED_BY(mu_);
  std::string last_sync_error_ ABSL_GUARDED_BY(mu_);
  bool last_sync_ok_ ABSL_GUARDED_BY(mu_) = false;
  int64_t started_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t succeeded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;  // bytes, successful syncs
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t local_ ABSL_GUARDED_BY(mu_) = 0;
  // Delta sync, of successful syncs: RankStats' words, summed over ranks.
  int64_t wire_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t staged_ ABSL_GUARDED_BY(mu_) = 0;  // RankStats.staged_sent_bytes: what whole chunks put on the wire
  int64_t delta_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t changed_words_ ABSL_GUARDED_BY(mu_) = 0;
  double encode_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double apply_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> full_chunks_ ABSL_GUARDED_BY(mu_);
  Histogram durations_ ABSL_GUARDED_BY(mu_){{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30}};
};

}  // namespace shardsync::coordinator

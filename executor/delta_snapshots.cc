#include "executor/delta_snapshots.h"

namespace shardsync::executor {

SnapshotLookup DeltaSnapshots::Find(absl::string_view sync_id, const std::string& digest, int32_t peer, int32_t round,
                                    const std::string& version, int64_t bytes) const {
  if (first_sync_.empty() || first_sync_ == sync_id) return {nullptr, "restarted_agent"};
  if (digest != digest_ || digest_since_ == sync_id) return {nullptr, "new_epoch"};
  if (over_budget_.count({peer, round}) > 0) return {nullptr, "over_budget"};
  const auto held = held_.find({peer, round});
  if (held == held_.end() || held->second.version != version ||
      static_cast<int64_t>(held->second.data.size()) != bytes) {
    return {nullptr, "stale_snapshot"};
  }
  return {&held->second.data, nullptr};
}

bool DeltaSnapshots::Keep(const std::string& digest, int32_t peer, int32_t round, const std::string& version,
                          const uint8_t* data, int64_t bytes) {
  if (first_sync_.empty()) first_sync_ = version;
  if (digest != digest_) {
    held_.clear();
    over_budget_.clear();
    held_bytes_ = 0;
    digest_ = digest;
    digest_since_ = version;
  }
  const auto held = held_.find({peer, round});
  if (held != held_.end()) {
    held_bytes_ -= static_cast<int64_t>(held->second.data.size());
    held_.erase(held);
  }
  if (held_bytes_ + bytes > budget_bytes_) {
    over_budget_.insert({peer, round});
    return false;
  }
  over_budget_.erase({peer, round});
  Snapshot& snapshot = held_[{peer, round}];
  snapshot.version = version;
  snapshot.data.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(bytes));
  held_bytes_ += bytes;
  return true;
}

}  // namespace shardsync::executor

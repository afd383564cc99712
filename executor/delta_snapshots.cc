#include "executor/delta_snapshots.h"

namespace shardsync::executor {

const std::string* DeltaSnapshots::Find(const std::string& digest, int32_t peer, int32_t round,
                                        const std::string& version, int64_t bytes) const {
  if (digest != digest_) return nullptr;
  const auto held = held_.find({peer, round});
  if (held == held_.end() || held->second.version != version ||
      static_cast<int64_t>(held->second.data.size()) != bytes) {
    return nullptr;
  }
  return &held->second.data;
}

bool DeltaSnapshots::Keep(const std::string& digest, int32_t peer, int32_t round, const std::string& version,
                          const uint8_t* data, int64_t bytes) {
  if (digest != digest_) {
    held_.clear();
    held_bytes_ = 0;
    digest_ = digest;
  }
  const auto held = held_.find({peer, round});
  if (held != held_.end()) {
    held_bytes_ -= static_cast<int64_t>(held->second.data.size());
    held_.erase(held);
  }
  if (held_bytes_ + bytes > budget_bytes_) return false;
  Snapshot& snapshot = held_[{peer, round}];
  snapshot.version = version;
  snapshot.data.assign(reinterpret_cast<const char*>(data), static_cast<size_t>(bytes));
  held_bytes_ += bytes;
  return true;
}

}  // namespace shardsync::executor

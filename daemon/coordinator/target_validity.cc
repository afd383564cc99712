#include "daemon/coordinator/target_validity.h"

namespace shardsync::coordinator {

void TargetValidity::Republished(int32_t rank) {
  absl::MutexLock lock(&mu_);
  published_.insert(rank);
  synced_.erase(rank);
  written_by_.erase(rank);
}

void TargetValidity::Restarted(int32_t rank) {
  absl::MutexLock lock(&mu_);
  restarted_.insert(rank);
  synced_.erase(rank);
  part_written_.erase(rank);
  written_by_.erase(rank);
}

void TargetValidity::Written(const std::vector<int32_t>& ranks, bool every_target, const std::string& sync_id) {
  absl::MutexLock lock(&mu_);
  // Every target there is now was written (a rank that left holds none to be invalid).
  if (every_target) part_written_.clear();
  for (int32_t rank : ranks) {
    part_written_.erase(rank);
    restarted_.erase(rank);
    published_.erase(rank);
    written_by_[rank] = sync_id;
  }
  synced_.insert(ranks.begin(), ranks.end());
}

void TargetValidity::PartlyWritten(const std::vector<int32_t>& ranks) {
  absl::MutexLock lock(&mu_);
  part_written_.insert(ranks.begin(), ranks.end());
  synced_.insert(ranks.begin(), ranks.end());
  for (int32_t rank : ranks) {
    written_by_.erase(rank);
    restarted_.erase(rank);
    published_.erase(rank);
  }
}

const std::string* TargetValidity::VersionLocked(int32_t rank, const std::string& own_word) const {
  if (part_written_.count(rank) > 0) return nullptr;
  if (synced_.count(rank) == 0) return own_word.empty() ? nullptr : &own_word;
  const auto written = written_by_.find(rank);
  return written == written_by_.end() ? nullptr : &written->second;
}

std::map<int32_t, std::string> TargetValidity::Versions(const std::map<int32_t, std::string>& by_own_word) const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::string> versions;
  for (const auto& [rank, word] : by_own_word) {
    if (const std::string* version = VersionLocked(rank, word)) versions[rank] = *version;
  }
  return versions;
}

std::map<int32_t, std::string> TargetValidity::Unversioned(const std::map<int32_t, std::string>& by_own_word) const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::string> why;
  for (const auto& [rank, word] : by_own_word) {
    if (VersionLocked(rank, word) != nullptr) continue;
    if (restarted_.count(rank) > 0) {
      why[rank] = "restarted_agent";
    } else if (published_.count(rank) > 0) {
      why[rank] = "new_target";
    } else {
      why[rank] = "invalid_target";
    }
  }
  return why;
}

std::set<int32_t> TargetValidity::Invalid(const std::map<int32_t, std::string>& by_own_word) const {
  absl::MutexLock lock(&mu_);
  std::set<int32_t> invalid = part_written_;
  for (const auto& [rank, word] : by_own_word) {
    if (VersionLocked(rank, word) == nullptr) invalid.insert(rank);
  }
  return invalid;
}

}  // namespace shardsync::coordinator

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

std::map<int32_t, std::string> TargetValidity::Versions(const std::map<int32_t, std::string>& by_own_word) const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::string> versions;
  for (const auto& [rank, word] : by_own_word) {
    if (part_written_.count(rank) > 0) continue;
    if (synced_.count(rank) == 0) {
      if (!word.empty()) versions[rank] = word;
      continue;
    }
    if (const auto written = written_by_.find(rank); written != written_by_.end()) versions[rank] = written->second;
  }
  return versions;
}

std::map<int32_t, std::string> TargetValidity::Unversioned(const std::map<int32_t, std::string>& by_own_word) const {
  const std::map<int32_t, std::string> versions = Versions(by_own_word);
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::string> why;
  for (const auto& [rank, word] : by_own_word) {
    if (versions.count(rank) > 0) continue;
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
    if (word.empty() && synced_.count(rank) == 0) invalid.insert(rank);
  }
  return invalid;
}

}  // namespace shardsync::coordinator

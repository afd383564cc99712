// Which ranks' targets hold a completed sync's bytes, and whose (their version: the
// sync's id). A sync of this coordinator that may have written part of a rank's targets
// makes them invalid until a sync writes them whole; for a rank no sync of this
// coordinator wrote since its last publication, its agent's own word counts (so a
// restarted coordinator or agent never calls half-written targets valid). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace shardsync::coordinator {

class TargetValidity {
 public:
  // The rank published again: its agent's word is newer than any sync of ours.
  void Republished(int32_t rank);
  // A new agent process holds the rank: its targets are new, its own word counts.
  void Restarted(int32_t rank);
  // Sync `sync_id` wrote `ranks` whole; `every_target`: it wrote every target there is.
  void Written(const std::vector<int32_t>& ranks, bool every_target, const std::string& sync_id);
  // A sync may have written part of `ranks`.
  void PartlyWritten(const std::vector<int32_t>& ranks);
  // The invalid ranks: those a sync left part written, and those of `by_own_word` (the
  // ranks holding targets, each with its agent's word: the version its targets hold,
  // empty for invalid) whose agent says so and that no sync of ours wrote since.
  std::set<int32_t> Invalid(const std::map<int32_t, std::string>& by_own_word) const;
  // The version of each valid rank's targets among `by_own_word` (the ranks holding
  // targets, each with its agent's word: empty for invalid): ours where a sync of ours
  // wrote the rank since its publication, else the agent's.
  std::map<int32_t, std::string> Versions(const std::map<int32_t, std::string>& by_own_word) const;
  // Why each rank of `by_own_word` without a version has none, a word: restarted_agent
  // (a new agent process holds it and no sync has written it since), new_target
  // (published since, and no sync has written it since), invalid_target (a sync left it
  // part written, or its agent says so).
  std::map<int32_t, std::string> Unversioned(const std::map<int32_t, std::string>& by_own_word) const;

 private:
  // The version of `rank`'s targets, given its agent's word; null when they hold none.
  const std::string* VersionLocked(int32_t rank, const std::string& own_word) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::set<int32_t> part_written_ ABSL_GUARDED_BY(mu_);
  std::set<int32_t> synced_ ABSL_GUARDED_BY(mu_);                   // since their last publication
  std::set<int32_t> restarted_ ABSL_GUARDED_BY(mu_);                // new agents no sync wrote since
  std::set<int32_t> published_ ABSL_GUARDED_BY(mu_);                // publications no sync wrote since
  std::map<int32_t, std::string> written_by_ ABSL_GUARDED_BY(mu_);  // the last sync of ours that wrote them whole
};

}  // namespace shardsync::coordinator

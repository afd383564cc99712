// What a sender last sent each peer, chunk by chunk, within a byte budget: the
// baselines of its deltas (delta_codec.h). A snapshot holds one sync's bytes of one
// chunk of one plan; a plan of another digest drops them all. Not thread-safe: the
// runs of one agent use it one at a time.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace shardsync::executor {

// A lookup's answer: the snapshot, or why there is none (a reason word of the stats:
// "restarted_agent" this agent kept nothing before this sync since it started,
// "new_epoch" nothing of this plan before this sync, "over_budget" the chunk did not
// fit last time, "stale_snapshot" the one kept is of another sync than the peer's
// targets hold).
struct SnapshotLookup {
  const std::string* data = nullptr;  // valid until the next Keep
  const char* missing = nullptr;      // set when data is null
};

class DeltaSnapshots {
 public:
  explicit DeltaSnapshots(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // For sync `sync_id` (what it kept so far does not count): the snapshot of the chunk
  // of round `round` to `peer` in plan `digest`, when it holds sync `version`'s bytes,
  // `bytes` of them.
  SnapshotLookup Find(absl::string_view sync_id, const std::string& digest, int32_t peer, int32_t round,
                      const std::string& version, int64_t bytes) const;
  // Keeps `data` as that chunk's snapshot of sync `version`, replacing the one before;
  // false (the old one dropped) when it does not fit the budget.
  bool Keep(const std::string& digest, int32_t peer, int32_t round, const std::string& version, const uint8_t* data,
            int64_t bytes);
  int64_t bytes() const { return held_bytes_; }

 private:
  struct Snapshot {
    std::string version;
    std::string data;
  };
  const int64_t budget_bytes_;
  std::string digest_;                                    // of the plan every snapshot belongs to
  std::map<std::pair<int32_t, int32_t>, Snapshot> held_;  // by (peer, round)
  std::set<std::pair<int32_t, int32_t>> over_budget_;     // chunks the last Keep of did not fit
  int64_t held_bytes_ = 0;
  std::string first_sync_;    // of this process's first Keep
  std::string digest_since_;  // the sync of the first Keep under digest_
};

}  // namespace shardsync::executor

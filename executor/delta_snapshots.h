// What a sender last sent each peer, chunk by chunk, within a byte budget: the
// baselines of its deltas (delta_codec.h). A snapshot holds one sync's bytes of one
// chunk of one plan; a plan of another digest drops them all. Not thread-safe: the
// runs of one agent use it one at a time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace shardsync::executor {

class DeltaSnapshots {
 public:
  explicit DeltaSnapshots(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // The snapshot of the chunk of round `round` to `peer` in plan `digest`, when it holds
  // sync `version`'s bytes, `bytes` of them; else null. Valid until the next Keep.
  const std::string* Find(const std::string& digest, int32_t peer, int32_t round, const std::string& version,
                          int64_t bytes) const;
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
  int64_t held_bytes_ = 0;
};

}  // namespace shardsync::executor

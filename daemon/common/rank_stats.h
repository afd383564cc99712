// The one place where a rank's stats become v1.RankStats: the planned ones
// (planner::RankStats, for Explain and `shardsyncctl plan`) and the measured ones of an
// Execute (executor::ExecutionStats). Nothing reads v1.RankStats back into either.
#pragma once

#include <cstdint>

#include "absl/time/time.h"
#include "executor/round_engine.h"
#include "planner/cost.h"
#include "proto/shardsync.pb.h"

namespace shardsync::daemon {

// Rank `rank`'s planned bytes, chunks and rounds.
v1::RankStats RankStatsOf(int32_t rank, const planner::RankStats& planned);

// When each part of an Execute ended, for its seconds.
struct ExecuteTimes {
  absl::Time entered, checked, agreed, finished;
};

// Rank `rank`'s measured run: bytes, chunks, rounds, staging, the scratch it held and
// where the Execute's time went.
v1::RankStats RankStatsOf(int32_t rank, const executor::ExecutionStats& measured, int64_t scratch_bytes,
                          const ExecuteTimes& times);

}  // namespace shardsync::daemon

// What a plan costs: bytes per rank and per link, and the time no method can beat.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::planner {

struct RankStats {
  int64_t sent_bytes = 0;      // to other ranks
  int64_t received_bytes = 0;  // from other ranks
  int64_t local_bytes = 0;     // copied on the rank itself
  int64_t fill_bytes = 0;      // zero-filled (padding with no source)
  int64_t segments = 0;        // local + sent + received
  int64_t chunks = 0;          // sent + received
  int32_t rounds = 0;
};

// Measured or assumed speeds, bytes per second.
struct Bandwidths {
  double link_bytes_per_s = 0;    // one direction of a rank's link to its peers
  double memory_bytes_per_s = 0;  // device memory read + write (a copy of n bytes moves 2n)
};

struct PlanStats {
  std::vector<RankStats> ranks;
  std::map<std::pair<int32_t, int32_t>, int64_t> link_bytes;  // (from, to) -> bytes
  int64_t total_sent_bytes = 0;
  int64_t total_local_bytes = 0;
  int64_t segments = 0;
  int64_t chunks = 0;
  int32_t rounds = 0;
};

PlanStats ComputeStats(const Plan& plan, const std::vector<Schedule>& schedules);

// The floor: every rank's sends, receives and local copies overlap, so a rank needs
// max(sent / link, received / link, (2 * local + fill) / memory) seconds; the sync needs the
// slowest rank's time.
double CostFloorSeconds(const PlanStats& stats, const Bandwidths& bandwidths);

// A 128-bit digest of the plan and its staging budget, as 32 hex digits: equal on every
// rank and every run for the same plan. Not cryptographic.
std::string PlanDigest(const Plan& plan, int64_t staging_bytes);

}  // namespace shardsync::planner

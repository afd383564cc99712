// What a plan costs: bytes per rank and per link, and the time no method can beat.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
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
  int64_t network_sent_bytes = 0;      // of sent_bytes: to ranks of other nodes
  int64_t network_received_bytes = 0;  // of received_bytes: from ranks of other nodes
  int64_t relayed_bytes = 0;           // of sent + local: forwarded from this rank's targets (relay stages)
  int64_t quantized_bytes = 0;         // float8 written by quantizing this rank's scratch (one per element)
};

// Measured or assumed speeds, bytes per second.
struct Bandwidths {
  double link_bytes_per_s = 0;     // one direction of a rank's link to the ranks of its node
  double memory_bytes_per_s = 0;   // device memory read + write (a copy of n bytes moves 2n)
  double network_bytes_per_s = 0;  // one direction of a rank's share of the network between nodes
};

struct PlanStats {
  std::vector<RankStats> ranks;                               // every stage
  std::vector<std::vector<RankStats>> stages;                 // [stage][rank]: bytes only
  std::map<std::pair<int32_t, int32_t>, int64_t> link_bytes;  // (from, to) -> bytes
  int64_t total_sent_bytes = 0;
  int64_t total_network_bytes = 0;  // of total_sent_bytes: between nodes
  int64_t total_relayed_bytes = 0;  // sent or copied in relay stages
  int64_t total_local_bytes = 0;
  int64_t segments = 0;
  int64_t chunks = 0;
  int32_t rounds = 0;
};

// Schedules may be empty: then only bytes are counted (no chunks or rounds).
PlanStats ComputeStats(const Plan& plan, const std::vector<Schedule>& schedules);

// PlanStats::stages alone (bytes per stage and rank): what the floor needs, without the
// per-link map.
std::vector<std::vector<RankStats>> StageBytes(const Plan& plan);

// Each rank's bytes over every stage (bytes only: chunks and rounds stay 0).
std::vector<RankStats> SumStages(const std::vector<std::vector<RankStats>>& stages, int32_t num_ranks);

// StageBytes of a plan made by StreamPlan: its segments added as they come, then its
// fills and quantizes from the plan StreamPlan returns. Holds bytes per stage and rank
// only, never a segment.
class StreamedStageBytes {
 public:
  // The input's ranks and nodes; at least `num_ranks` ranks.
  explicit StreamedStageBytes(const PlanInput& input, int32_t num_ranks = 0);
  void Add(absl::Span<const Segment> segments);
  std::vector<std::vector<RankStats>> Finish(const Plan& plan);
  int64_t segments() const { return segments_; }

 private:
  std::vector<int32_t> node_of_rank_;
  int32_t num_ranks_ = 0;
  std::vector<std::vector<RankStats>> stages_;
  int64_t segments_ = 0;
};

// PlanStats of a plan made by StreamPlan, chunks and rounds as MakeSchedules cuts them
// at `staging_bytes`, from its segments as they come; and each stage's first round.
// Holds counts per rank, stage and link only, never a segment. Add refuses what
// MakeSchedules refuses.
class StreamedStats {
 public:
  // At least `num_ranks` ranks (those of the input's buffers and any past them).
  StreamedStats(const PlanInput& input, int64_t staging_bytes, int32_t num_ranks);
  absl::Status Add(absl::Span<const Segment> segments);
  // `plan`: what StreamPlan returned (its fills and quantizes are counted here), with
  // num_ranks as given above.
  PlanStats Finish(const Plan& plan, std::vector<int32_t>* first_rounds);

 private:
  StreamedStageBytes stage_bytes_;
  RoundCounter rounds_;
  PlanStats totals_;  // the totals (link bytes: rounds_)
  std::vector<int32_t> node_of_rank_;
};

// The floor: within a stage every rank's sends, receives and local copies overlap, and
// so do its link to its node and its share of the network, so a rank needs the largest
// of sent / link, received / link, network sent / network, network received / network
// and (2 * local + fill + 3 * quantized) / memory seconds (bytes to other nodes count on the network,
// not the link); a stage needs its slowest rank's time, and the stages follow each other.
double CostFloorSeconds(const PlanStats& stats, const Bandwidths& bandwidths);
double CostFloorSeconds(const std::vector<std::vector<RankStats>>& stages, const Bandwidths& bandwidths);
// Each stage's part of that floor, in order (they add up to it).
std::vector<double> StageFloorSeconds(const std::vector<std::vector<RankStats>>& stages, const Bandwidths& bandwidths);

}  // namespace shardsync::planner

#include "planner/cost.h"

#include <algorithm>
#include <string>

#include "common/status_macros.h"

namespace shardsync::planner {

namespace {

int32_t NodeOf(const std::vector<int32_t>& node_of_rank, int32_t rank) {
  return node_of_rank.empty() ? 0 : node_of_rank[rank];
}

// Adds a segment's bytes to the ranks it touches.
void CountSegment(const std::vector<int32_t>& node_of_rank, const Segment& s, std::vector<RankStats>& ranks) {
  const int64_t bytes = SegmentBytes(s);
  RankStats& from = ranks[s.src.rank];
  ++from.segments;
  if (IsRelayStage(s.stage)) from.relayed_bytes += bytes;
  if (s.src.rank == s.dst.rank) {
    from.local_bytes += bytes;
    return;
  }
  RankStats& to = ranks[s.dst.rank];
  ++to.segments;
  from.sent_bytes += bytes;
  to.received_bytes += bytes;
  if (NodeOf(node_of_rank, s.src.rank) != NodeOf(node_of_rank, s.dst.rank)) {
    from.network_sent_bytes += bytes;
    to.network_received_bytes += bytes;
  }
}

// Adds a segment to a plan's totals, and to its link bytes if `links`.
void CountTotals(const std::vector<int32_t>& node_of_rank, const Segment& s, PlanStats& stats, bool links) {
  const int64_t bytes = SegmentBytes(s);
  ++stats.segments;
  if (IsRelayStage(s.stage)) stats.total_relayed_bytes += bytes;
  if (s.src.rank == s.dst.rank) {
    stats.total_local_bytes += bytes;
    return;
  }
  if (NodeOf(node_of_rank, s.src.rank) != NodeOf(node_of_rank, s.dst.rank)) stats.total_network_bytes += bytes;
  if (links) stats.link_bytes[{s.src.rank, s.dst.rank}] += bytes;
  stats.total_sent_bytes += bytes;
}

// A plan's fills and quantizes, added to its stage bytes.
void CountFillsAndQuantizes(const Plan& plan, std::vector<std::vector<RankStats>>& stages) {
  for (const FillOp& f : plan.fills) {
    stages[0][f.fill.holder.rank].fill_bytes += NumElements(f.fill.shape) * ElementBytes(f.dtype);
  }
  for (const QuantizeOp& q : plan.quantizes) stages[q.stage][q.target.rank].quantized_bytes += q.rows * q.cols;
}

}  // namespace

std::vector<std::vector<RankStats>> StageBytes(const Plan& plan) {
  std::vector<std::vector<RankStats>> stages(plan.stages, std::vector<RankStats>(plan.num_ranks));
  for (const Segment& s : plan.segments) CountSegment(plan.node_of_rank, s, stages[s.stage]);
  CountFillsAndQuantizes(plan, stages);
  return stages;
}

StreamedStageBytes::StreamedStageBytes(const PlanInput& input, int32_t num_ranks)
    : node_of_rank_(input.node_of_rank), num_ranks_(std::max(num_ranks, NumRanks(input))) {}

void StreamedStageBytes::Add(absl::Span<const Segment> segments) {
  for (const Segment& s : segments) {
    while (static_cast<int32_t>(stages_.size()) <= s.stage) stages_.emplace_back(num_ranks_);
    CountSegment(node_of_rank_, s, stages_[s.stage]);
  }
  segments_ += static_cast<int64_t>(segments.size());
}

std::vector<std::vector<RankStats>> StreamedStageBytes::Finish(const Plan& plan) {
  while (static_cast<int32_t>(stages_.size()) < plan.stages) stages_.emplace_back(num_ranks_);
  CountFillsAndQuantizes(plan, stages_);
  return std::move(stages_);
}

std::vector<RankStats> SumStages(const std::vector<std::vector<RankStats>>& stages, int32_t num_ranks) {
  std::vector<RankStats> ranks(num_ranks);
  for (const std::vector<RankStats>& stage : stages) {
    for (int32_t r = 0; r < num_ranks; ++r) {
      RankStats& total = ranks[r];
      const RankStats& part = stage[r];
      total.sent_bytes += part.sent_bytes;
      total.received_bytes += part.received_bytes;
      total.local_bytes += part.local_bytes;
      total.fill_bytes += part.fill_bytes;
      total.segments += part.segments;
      total.network_sent_bytes += part.network_sent_bytes;
      total.network_received_bytes += part.network_received_bytes;
      total.relayed_bytes += part.relayed_bytes;
      total.quantized_bytes += part.quantized_bytes;
    }
  }
  return ranks;
}

PlanStats ComputeStats(const Plan& plan, const std::vector<Schedule>& schedules) {
  PlanStats stats;
  stats.stages = StageBytes(plan);
  stats.ranks = SumStages(stats.stages, plan.num_ranks);
  for (const Segment& s : plan.segments) CountTotals(plan.node_of_rank, s, stats, /*links=*/true);
  for (const Schedule& schedule : schedules) {
    RankStats& r = stats.ranks[schedule.rank];
    for (const Stage& stage : schedule.stages) {
      for (const auto* streams : {&stage.sends, &stage.receives}) {
        for (const PeerStream& stream : *streams) r.chunks += static_cast<int64_t>(stream.chunks.size());
      }
      for (const PeerStream& stream : stage.sends) stats.chunks += static_cast<int64_t>(stream.chunks.size());
    }
    r.rounds = schedule.rounds();
    stats.rounds = std::max(stats.rounds, r.rounds);
  }
  return stats;
}

namespace {

std::vector<std::string> TensorNames(const PlanInput& input) {
  std::vector<std::string> names;
  names.reserve(input.tensors.size());
  for (const TensorLayouts& t : input.tensors) names.push_back(t.name);
  return names;
}

}  // namespace

StreamedStats::StreamedStats(const PlanInput& input, int64_t staging_bytes, int32_t num_ranks)
    : stage_bytes_(input, num_ranks),
      rounds_(std::max(num_ranks, NumRanks(input)), staging_bytes, TensorNames(input)),
      node_of_rank_(input.node_of_rank) {}

absl::Status StreamedStats::Add(absl::Span<const Segment> segments) {
  SHARDSYNC_RETURN_IF_ERROR(rounds_.Add(segments));
  stage_bytes_.Add(segments);
  for (const Segment& s : segments) CountTotals(node_of_rank_, s, totals_, /*links=*/false);  // RoundCounter's
  return absl::OkStatus();
}

PlanStats StreamedStats::Finish(const Plan& plan, std::vector<int32_t>* first_rounds) {
  PlanStats stats = std::move(totals_);
  stats.stages = stage_bytes_.Finish(plan);
  stats.ranks = SumStages(stats.stages, plan.num_ranks);
  RoundCounts counts = rounds_.Finish(plan.stages);
  for (int32_t r = 0; r < plan.num_ranks && r < static_cast<int32_t>(counts.chunks.size()); ++r) {
    RankStats& rank = stats.ranks[r];
    rank.chunks = counts.chunks[r];
    for (const std::vector<int32_t>& stage : counts.rounds) rank.rounds += stage[r];
    stats.rounds = std::max(stats.rounds, rank.rounds);
  }
  stats.chunks = counts.link_chunks;
  stats.link_bytes = std::move(counts.link_bytes);
  *first_rounds = std::move(counts.first_rounds);
  return stats;
}

double CostFloorSeconds(const PlanStats& stats, const Bandwidths& bw) { return CostFloorSeconds(stats.stages, bw); }

double CostFloorSeconds(const std::vector<std::vector<RankStats>>& stages, const Bandwidths& bw) {
  double floor = 0;
  for (double stage : StageFloorSeconds(stages, bw)) floor += stage;
  return floor;
}

std::vector<double> StageFloorSeconds(const std::vector<std::vector<RankStats>>& stages, const Bandwidths& bw) {
  std::vector<double> floors;
  for (const std::vector<RankStats>& stage : stages) {
    double slowest = 0;
    for (const RankStats& r : stage) {
      const double link = std::max(r.sent_bytes - r.network_sent_bytes, r.received_bytes - r.network_received_bytes) /
                          bw.link_bytes_per_s;
      const int64_t network_bytes = std::max(r.network_sent_bytes, r.network_received_bytes);
      const double network = network_bytes > 0 ? network_bytes / bw.network_bytes_per_s : 0;
      // A copy reads and writes each byte; a fill only writes; quantizing reads two
      // bytes of scratch and writes one per element.
      const double memory = (2.0 * r.local_bytes + r.fill_bytes + 3.0 * r.quantized_bytes) / bw.memory_bytes_per_s;
      slowest = std::max({slowest, link, network, memory});
    }
    floors.push_back(slowest);
  }
  return floors;
}

}  // namespace shardsync::planner

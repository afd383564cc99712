#include "daemon/common/plan_report.h"

#include <string>

#include "daemon/common/rank_stats.h"

namespace shardsync::daemon {

std::vector<v1::LinkBytes> LinksOf(const planner::PlanStats& stats) {
  std::vector<v1::LinkBytes> links;
  for (const auto& [link, bytes] : stats.link_bytes) {
    v1::LinkBytes& out = links.emplace_back();
    out.set_from_rank(link.first);
    out.set_to_rank(link.second);
    out.set_bytes(bytes);
  }
  return links;
}

v1::ExplainResponse MakePlanReport(const planner::Plan& plan, const planner::PlanStats& stats, absl::string_view digest,
                                   std::pair<double, double> floors, const planner::Bandwidths& bandwidths,
                                   bool links) {
  v1::ExplainResponse report;
  report.set_digest(std::string(digest));
  report.set_tensors(static_cast<int32_t>(plan.tensor_names.size()));
  report.set_segments(stats.segments);
  report.set_chunks(stats.chunks);
  report.set_rounds(stats.rounds);
  report.set_floor_seconds(planner::CostFloorSeconds(stats, bandwidths));
  report.set_stages(plan.stages);
  report.set_network_bytes(stats.total_network_bytes);
  report.set_relayed_bytes(stats.total_relayed_bytes);
  report.set_unrelayed_floor_seconds(floors.first);
  report.set_relayed_floor_seconds(floors.second);
  report.set_link_gbps(bandwidths.link_bytes_per_s / 1e9);
  report.set_memory_gbps(bandwidths.memory_bytes_per_s / 1e9);
  report.set_network_gbps(bandwidths.network_bytes_per_s / 1e9);
  for (size_t r = 0; r < stats.ranks.size(); ++r) {
    *report.add_ranks() = RankStatsOf(static_cast<int32_t>(r), stats.ranks[r]);
  }
  for (const planner::Buffer& b : plan.scratch) {
    if (b.holder.rank < report.ranks_size()) report.mutable_ranks(b.holder.rank)->set_scratch_bytes(b.bytes);
  }
  if (links) {
    for (v1::LinkBytes& link : LinksOf(stats)) *report.add_links() = std::move(link);
  }
  return report;
}

}  // namespace shardsync::daemon

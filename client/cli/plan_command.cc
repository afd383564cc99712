#include "client/cli/plan_command.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/format.h"
#include "planner/model_layout.h"
#include "planner/known_models.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/cost.h"
#include "planner/digest.h"
#include "planner/relay.h"
#include "spec/layout_spec.h"

namespace shardsync::cli {
namespace {

absl::StatusOr<planner::PlanInput> LoadInput(const PlanCommandConfig& c, std::string* label) {
  v1::LayoutSpec spec;
  if (!c.spec_path.empty()) {
    auto read = spec::ReadLayoutSpecFile(c.spec_path);
    if (!read.ok()) return read.status();
    spec = *std::move(read);
    *label = c.spec_path;
  } else {
    v1::ModelLayout* model = spec.mutable_model();
    model->set_preset(c.model);
    model->set_fused(c.fused);
    model->set_zero_stage(c.zero_stage);
    for (int r = 0; r < c.dp; ++r) model->add_dp_ranks(r);
    for (int k = 0; k < c.replicas; ++k) {
      v1::Replica* replica = model->add_replicas();
      for (int t = 0; t < c.tp; ++t) replica->add_ranks(c.rollout_rank + k * c.tp + t);
    }
    *label = absl::StrCat(c.model, " zero", c.zero_stage, "x", c.dp, " -> tp", c.tp, "x", c.replicas,
                          c.rollout_rank > 0 ? absl::StrCat(" from rank ", c.rollout_rank) : "", c.fused ? " fused" : "");
  }
  spec::BufferIds ids;
  auto input = spec::ToPlanInput(spec, ids);
  if (!input.ok() || c.ranks_per_node == 0) return input;
  int32_t ranks = 0;
  for (const planner::Buffer& b : input->buffers) ranks = std::max(ranks, b.holder.rank + 1);
  for (int32_t r = 0; r < ranks; ++r) input->node_of_rank.push_back(r / c.ranks_per_node);
  absl::StrAppend(label, ", ", c.ranks_per_node, " ranks per node");
  return input;
}

}  // namespace

int RunPlanCommand(const PlanCommandConfig& c, std::ostream& out, std::ostream& err) {
  std::string label;
  auto input = LoadInput(c, &label);
  if (!input.ok()) {
    err << "shardsyncctl plan: " << input.status().message() << "\n";
    return 3;
  }
  const auto policy = c.policy == "first_holder" ? planner::FirstHolder() : planner::LocalFirstLeastLoaded();
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const planner::Bandwidths bandwidths{c.link_gbps * 1e9, c.memory_gbps * 1e9, c.network_gbps * 1e9};
  std::pair<double, double> floors{0, 0};  // direct, relayed: what auto compared
  auto plan = planner::MakePlanWithRelay(*input, *policy, c.relay, bandwidths, &floors);
  const auto t1 = Clock::now();
  if (!plan.ok()) {
    err << "shardsyncctl plan: " << plan.status().message() << "\n";
    return 3;
  }
  auto schedules = planner::MakeSchedules(*plan, c.staging_bytes);
  const auto t2 = Clock::now();
  if (!schedules.ok()) {
    err << "shardsyncctl plan: " << schedules.status().message() << "\n";
    return 3;
  }
  const planner::PlanStats stats = planner::ComputeStats(*plan, *schedules);
  const double floor_s = planner::CostFloorSeconds(stats, bandwidths);
  const double plan_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double schedule_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  const std::string digest = planner::PlanDigest(*plan, c.staging_bytes);
  int64_t total_bytes = stats.total_sent_bytes + stats.total_local_bytes;

  if (c.json) {
    out << absl::StrFormat(
        "{\"layout\":\"%s\",\"policy\":\"%s\",\"tensors\":%d,\"ranks\":%d,\"segments\":%d,\"chunks\":%d,"
        "\"rounds\":%d,\"bytes\":%d,\"bytes_sent\":%d,\"bytes_local\":%d,\"plan_ms\":%.3f,\"schedule_ms\":%.3f,"
        "\"floor_s\":%.6f,\"link_gbps\":%g,\"memory_gbps\":%g,\"network_gbps\":%g,\"stages\":%d,"
        "\"bytes_network\":%d,\"bytes_relayed\":%d,\"direct_floor_s\":%.6f,\"relayed_floor_s\":%.6f,"
        "\"staging_bytes\":%d,\"digest\":\"%s\",\"ranks_detail\":[",
        label, policy->name(), input->tensors.size(), plan->num_ranks, stats.segments, stats.chunks, stats.rounds,
        total_bytes, stats.total_sent_bytes, stats.total_local_bytes, plan_ms, schedule_ms, floor_s, c.link_gbps,
        c.memory_gbps, c.network_gbps, plan->stages, stats.total_network_bytes, stats.total_relayed_bytes, floors.first,
        floors.second, c.staging_bytes, digest);
    for (size_t r = 0; r < stats.ranks.size(); ++r) {
      const planner::RankStats& s = stats.ranks[r];
      out << absl::StrFormat("%s{\"rank\":%d,\"sent\":%d,\"received\":%d,\"local\":%d,\"fill\":%d,\"segments\":%d,"
                             "\"chunks\":%d,\"rounds\":%d,\"network_sent\":%d,\"network_received\":%d,\"relayed\":%d}",
                             r ? "," : "", r, s.sent_bytes, s.received_bytes, s.local_bytes, s.fill_bytes, s.segments,
                             s.chunks, s.rounds, s.network_sent_bytes, s.network_received_bytes, s.relayed_bytes);
    }
    out << "]}\n";
    return 0;
  }
  out << absl::StrFormat("plan      %s (policy %s)\n", label, policy->name());
  out << absl::StrFormat("tensors   %d on %d ranks: %d segments, %d chunks, %d rounds\n", input->tensors.size(),
                         plan->num_ranks, stats.segments, stats.chunks, stats.rounds);
  out << absl::StrFormat("moves     %s (%s over links, %s local)\n", Bytes(total_bytes), Bytes(stats.total_sent_bytes),
                         Bytes(stats.total_local_bytes));
  if (c.ranks_per_node > 0) {
    out << absl::StrFormat("nodes     %s between nodes; %s%s\n", Bytes(stats.total_network_bytes),
                           plan->stages > 1 ? absl::StrCat("relayed, ", Bytes(stats.total_relayed_bytes),
                                                           " forwarded from targets in stage 2")
                                            : "not relayed",
                           floors.first > 0 ? absl::StrFormat(" (floor %.3f ms direct, %.3f ms relayed)",
                                                              floors.first * 1e3, floors.second * 1e3)
                                            : "");
  }
  out << absl::StrFormat("planned   in %.2f ms, scheduled in %.2f ms, staging %s per peer, digest %s\n\n", plan_ms,
                         schedule_ms, Bytes(c.staging_bytes), digest);
  out << absl::StrFormat("%-6s %12s %12s %12s %10s %9s %7s %7s\n", "rank", "sent", "received", "local", "fill",
                         "segments", "chunks", "rounds");
  for (size_t r = 0; r < stats.ranks.size(); ++r) {
    const planner::RankStats& s = stats.ranks[r];
    out << absl::StrFormat("%-6d %12s %12s %12s %10s %9d %7d %7d\n", r, Bytes(s.sent_bytes), Bytes(s.received_bytes),
                           Bytes(s.local_bytes), Bytes(s.fill_bytes), s.segments, s.chunks, s.rounds);
  }
  out << absl::StrFormat("\nfloor     %.3f ms at %g GB/s per link direction, %g GB/s memory (read + write)%s\n",
                         floor_s * 1e3, c.link_gbps, c.memory_gbps,
                         c.ranks_per_node > 0 ? absl::StrFormat(" and %g GB/s network", c.network_gbps) : "");
  return 0;
}

}  // namespace shardsync::cli

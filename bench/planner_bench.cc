// Planner benchmark: one JSON line per case with wall milliseconds (median of the
// repeats) of planning and scheduling, and what the plan moves.
//   bazel run -c opt //bench:planner_bench -- [--case NAME]... [--repeats N] [--staging-bytes B]
//                                              [--moe-layers N] [--moe-dense-layers N]
//                                              [--moe-streamed-layers N]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner/cost.h"
#include "planner/digest.h"
#include "planner/known_models.h"
#include "planner/model_layout.h"
#include "planner/moe_layout.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "planner/schedule.h"

namespace shardsync::bench {
namespace {

struct Config {
  std::vector<std::string> cases;  // empty: all
  int repeats = 5;
  int64_t staging_bytes = int64_t{128} << 20;
  int moe_layers = 61;  // layers of the experts-only MoE case
  // Layers of the MoE case with dense tensors too: ZeRO-3 over all 1,024 ranks into TP=4
  // in every rollout group makes ~10M segments per layer, so the whole model does not
  // fit this machine's memory; the case runs a slice of it.
  int moe_dense_layers = 2;
  int moe_streamed_layers = 61;  // layers of the streamed MoE case (experts and dense)
};

struct Case {
  std::string name;
  int repeats;  // the MoE cases run once
  std::function<planner::PlanInput()> make;
  planner::RelayMode relay = planner::RelayMode::kNever;
  bool streamed = false;  // StreamPlan: bytes counted as segments come, none kept, no schedules
};

using Clock = std::chrono::steady_clock;

// Nominal speeds for scale only: 360 GB/s of NVLink and 4.2 TB/s of memory per H200, and a
// 400 Gb/s NIC (50 GB/s) per GPU.
const planner::Bandwidths kBandwidths{360e9, 4.2e12, 50e9};
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> Range(int n) {
  std::vector<int32_t> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

// Qwen3-8B, ZeRO-3 over 8 ranks, into `replicas` TP groups covering ranks 0..7.
planner::PlanInput Qwen8B(int tp) {
  planner::ModelLayoutSpec spec = planner::Qwen3Layout(*planner::FindDenseModel("qwen3-8b"), /*fused=*/false);
  spec.zero_stage = 3;
  spec.dp_ranks = Range(8);
  for (int k = 0; k < 8 / tp; ++k) {
    std::vector<int32_t> ranks;
    for (int t = 0; t < tp; ++t) ranks.push_back(k * tp + t);
    spec.replicas.push_back(ranks);
  }
  return *planner::ExpandModel(spec);
}

// Qwen3-8B disaggregated: the trainer ZeRO-3 over the 8 ranks of node 0, the rollout
// TP2 x 4 on the 8 ranks of node 1.
planner::PlanInput Qwen8BTwoNodes() {
  planner::ModelLayoutSpec spec = planner::Qwen3Layout(*planner::FindDenseModel("qwen3-8b"), /*fused=*/false);
  spec.zero_stage = 3;
  spec.dp_ranks = Range(8);
  for (int k = 0; k < 4; ++k) spec.replicas.push_back({8 + 2 * k, 9 + 2 * k});
  planner::PlanInput input = *planner::ExpandModel(spec);
  for (int r = 0; r < 16; ++r) input.node_of_rank.push_back(r / 8);
  return input;
}

std::vector<Case> AllCases(const Config& config) {
  planner::MoeShape experts;
  experts.layers = config.moe_layers;
  experts.dense = false;
  planner::MoeShape dense;
  dense.layers = config.moe_dense_layers;
  planner::MoeShape whole;
  whole.layers = config.moe_streamed_layers;
  return {
      {"qwen3-8b zero3x8 -> tp4x2", 0, [] { return Qwen8B(4); }},
      {"qwen3-8b zero3x8 -> tp8", 0, [] { return Qwen8B(8); }},
      {"qwen3-8b zero3x8 -> tp1x8", 0, [] { return Qwen8B(1); }},
      {"qwen3-8b zero3x8 node 0 -> tp2x4 node 1, unrelayed", 0, Qwen8BTwoNodes, planner::RelayMode::kNever},
      {"qwen3-8b zero3x8 node 0 -> tp2x4 node 1, relayed", 0, Qwen8BTwoNodes, planner::RelayMode::kAlways},
      {"qwen3-8b zero3x8 node 0 -> tp2x4 node 1, cheaper of both", 0, Qwen8BTwoNodes, planner::RelayMode::kAuto},
      {absl::StrCat("moe-1t experts ep64xdp16 -> 8x(ep32xtp4), ", experts.layers, " of 61 layers"), 1,
       [experts] { return planner::MoeLayout(experts); }},
      {absl::StrCat("moe-1t experts + dense zero3x1024 -> 8x(ep32xtp4), ", dense.layers, " of 61 layers"), 1,
       [dense] { return planner::MoeLayout(dense); }},
      {absl::StrCat("moe-1t streamed, experts + dense zero3x1024 -> 8x(ep32xtp4), ", whole.layers, " of 61 layers"), 1,
       [whole] { return planner::MoeLayout(whole); }, planner::RelayMode::kNever, /*streamed=*/true},
  };
}

int64_t PeakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024;
}

// StreamPlan of a case: its segments counted (bytes per stage and rank) and dropped.
int RunStreamedCase(const Case& c, const planner::PlanInput& input, double layout_ms) {
  const auto policy = planner::LocalFirstLeastLoaded();
  planner::StreamedStageBytes bytes(input);
  const auto start = Clock::now();
  auto plan = planner::StreamPlan(input, *policy, planner::PlanOptions{}, [&](absl::Span<const planner::Segment> made) {
    bytes.Add(made);
    return absl::OkStatus();
  });
  const double plan_ms = Ms(start, Clock::now());
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name.c_str(), std::string(plan.status().message()).c_str());
    return 1;
  }
  const int64_t segments = bytes.segments();
  const std::vector<std::vector<planner::RankStats>> stages = bytes.Finish(*plan);
  int64_t sent = 0, max_sent = 0, max_received = 0;
  for (const planner::RankStats& r : planner::SumStages(stages, plan->num_ranks)) {
    sent += r.sent_bytes;
    max_sent = std::max(max_sent, r.sent_bytes);
    max_received = std::max(max_received, r.received_bytes);
  }
  std::printf(
      "{\"case\":\"%s\",\"tensors\":%zu,\"ranks\":%d,\"segments\":%lld,\"layout_ms\":%.2f,\"plan_ms\":%.2f,"
      "\"ns_per_segment\":%.1f,\"bytes_sent\":%lld,\"max_rank_sent\":%lld,\"max_rank_received\":%lld,"
      "\"floor_ms_at_360GBps_50GBps_network\":%.3f,\"peak_rss_mib\":%lld}\n",
      c.name.c_str(), input.tensors.size(), plan->num_ranks, static_cast<long long>(segments), layout_ms, plan_ms,
      1e6 * plan_ms / std::max<int64_t>(1, segments), static_cast<long long>(sent), static_cast<long long>(max_sent),
      static_cast<long long>(max_received), 1e3 * planner::CostFloorSeconds(stages, kBandwidths),
      static_cast<long long>(PeakRssMiB()));
  std::fflush(stdout);
  return 0;
}

int RunCase(const Case& c, const Config& config) {
  const auto t0 = Clock::now();
  const planner::PlanInput input = c.make();
  const double layout_ms = Ms(t0, Clock::now());
  if (c.streamed) return RunStreamedCase(c, input, layout_ms);
  const auto policy = planner::LocalFirstLeastLoaded();
  std::vector<double> plan_ms, schedule_ms;
  planner::Plan plan;
  std::vector<planner::Schedule> schedules;
  for (int i = 0; i < (c.repeats > 0 ? c.repeats : config.repeats); ++i) {
    const auto a = Clock::now();
    auto p = planner::MakePlanWithRelay(input, *policy, c.relay, kBandwidths);
    const auto b = Clock::now();
    if (!p.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), std::string(p.status().message()).c_str());
      return 1;
    }
    auto s = planner::MakeSchedules(*p, config.staging_bytes);
    const auto d = Clock::now();
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), std::string(s.status().message()).c_str());
      return 1;
    }
    plan_ms.push_back(Ms(a, b));
    schedule_ms.push_back(Ms(b, d));
    plan = *std::move(p);
    schedules = *std::move(s);
  }
  // The coordinator names every plan by its digest: timed apart, not part of planning.
  const auto digest_start = Clock::now();
  const std::string digest = planner::PlanDigest(plan, config.staging_bytes);
  const double digest_ms = Ms(digest_start, Clock::now());
  const planner::PlanStats stats = planner::ComputeStats(plan, schedules);
  int64_t max_sent = 0, max_received = 0, max_local = 0, max_segments = 0;
  std::vector<std::string> per_rank;
  for (size_t r = 0; r < stats.ranks.size(); ++r) {
    const planner::RankStats& s = stats.ranks[r];
    max_sent = std::max(max_sent, s.sent_bytes);
    max_received = std::max(max_received, s.received_bytes);
    max_local = std::max(max_local, s.local_bytes);
    max_segments = std::max(max_segments, s.segments);
    if (stats.ranks.size() <= 8) {
      per_rank.push_back(absl::StrCat("{\"rank\":", r, ",\"sent\":", s.sent_bytes, ",\"received\":", s.received_bytes,
                                      ",\"local\":", s.local_bytes, ",\"segments\":", s.segments, "}"));
    }
  }
  const double floor_ms = 1e3 * planner::CostFloorSeconds(stats, kBandwidths);
  std::vector<std::string> stage_floors_ms;
  for (double seconds : planner::StageFloorSeconds(stats.stages, kBandwidths)) {
    stage_floors_ms.push_back(absl::StrFormat("%.3f", seconds * 1e3));
  }
  std::printf(
      "{\"case\":\"%s\",\"tensors\":%zu,\"ranks\":%d,\"segments\":%lld,\"chunks\":%lld,\"rounds\":%d,"
      "\"layout_ms\":%.2f,\"plan_ms\":%.2f,\"ns_per_segment\":%.1f,\"schedule_ms\":%.2f,\"total_ms\":%.2f,"
      "\"repeats\":%zu,"
      "\"bytes_sent\":%lld,\"bytes_local\":%lld,\"max_rank_sent\":%lld,\"max_rank_received\":%lld,"
      "\"max_rank_local\":%lld,\"max_rank_segments\":%lld,\"floor_ms_at_360GBps_50GBps_network\":%.3f,"
      "\"stage_floors_ms\":[%s],\"stages\":%d,\"bytes_network\":%lld,\"bytes_relayed\":%lld,\"digest\":\"%s\","
      "\"digest_ms\":%.2f,"
      "\"peak_rss_mib\":%lld,\"per_rank\":[%s]}\n",
      c.name.c_str(), input.tensors.size(), plan.num_ranks, static_cast<long long>(stats.segments),
      static_cast<long long>(stats.chunks), stats.rounds, layout_ms, Median(plan_ms),
      1e6 * Median(plan_ms) / std::max<int64_t>(1, stats.segments), Median(schedule_ms),
      Median(plan_ms) + Median(schedule_ms), plan_ms.size(), static_cast<long long>(stats.total_sent_bytes),
      static_cast<long long>(stats.total_local_bytes), static_cast<long long>(max_sent),
      static_cast<long long>(max_received), static_cast<long long>(max_local), static_cast<long long>(max_segments),
      floor_ms, absl::StrJoin(stage_floors_ms, ",").c_str(), plan.stages,
      static_cast<long long>(stats.total_network_bytes), static_cast<long long>(stats.total_relayed_bytes),
      digest.c_str(), digest_ms, static_cast<long long>(PeakRssMiB()), absl::StrJoin(per_rank, ",").c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace shardsync::bench

int main(int argc, char** argv) {
  using shardsync::bench::Config;
  Config config;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--case" && has_value) {
      config.cases.push_back(argv[++i]);
    } else if (arg == "--repeats" && has_value) {
      config.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--moe-layers" && has_value) {
      config.moe_layers = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--moe-dense-layers" && has_value) {
      config.moe_dense_layers = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--moe-streamed-layers" && has_value) {
      config.moe_streamed_layers = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--staging-bytes" && has_value) {
      config.staging_bytes = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: planner_bench [--case NAME]... [--repeats N] [--staging-bytes B] [--moe-layers N]\n"
                   "                     [--moe-dense-layers N] [--moe-streamed-layers N]\n"
                   "  --case NAME         run only cases whose name starts with NAME (repeatable)\n"
                   "  --repeats N         timed repeats of the small cases, median reported (5)\n"
                   "  --staging-bytes B   staging budget per peer, both directions (134217728)\n"
                   "  --moe-layers N        layers of the experts-only MoE case (61)\n"
                   "  --moe-dense-layers N  layers of the MoE case with dense tensors (2)\n"
                   "  --moe-streamed-layers N  layers of the streamed MoE case, experts and dense (61)\n");
      return 2;
    }
  }
  int failures = 0;
  for (const auto& c : shardsync::bench::AllCases(config)) {
    bool wanted = config.cases.empty();
    for (const std::string& prefix : config.cases) wanted = wanted || c.name.rfind(prefix, 0) == 0;
    if (wanted) failures += shardsync::bench::RunCase(c, config);
  }
  return failures == 0 ? 0 : 1;
}

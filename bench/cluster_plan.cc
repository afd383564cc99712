// What shardsync would plan on real clusters: MoE models from a disaggregated trainer
// into rollout replicas on other nodes, 8 GPUs a node, one NIC per GPU. Each case is
// planned with StreamPlan (no segment kept), with and without the relay, and printed
// as one JSON line: the planned floor, the bytes into the rollout's NICs (busiest
// against the even share: everything the rollout side receives over its NICs) and out
// of the trainer's, the physical floor (the even share over the NIC's rate) and the
// model's (every replica's bytes over the rollout's NICs, as if nothing crossed twice).
//   bazel build -c opt //bench:cluster_plan && bazel-bin/bench/cluster_plan [--case NAME]...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "planner/cost.h"
#include "planner/moe_layout.h"
#include "planner/plan.h"

namespace shardsync::bench {
namespace {

struct ClusterCase {
  const char* name;
  planner::MoeShape shape;
  planner::Bandwidths bandwidths;  // per GPU: NVLink one way, memory, NIC
};

// H100 and H200: 450 GB/s of NVLink each way; a 400 Gb/s NIC per GPU.
constexpr double kNvlink = 450e9, kNic = 50e9;

planner::MoeShape Shape(int layers, int experts, int hidden, int expert_intermediate, int train_ep, int train_dp,
                        int replicas, int infer_ep) {
  planner::MoeShape m;
  m.layers = layers;
  m.experts = experts;
  m.hidden = hidden;
  m.expert_intermediate = expert_intermediate;
  m.train_ep = train_ep;
  m.train_dp = train_dp;
  m.replicas = replicas;
  m.infer_ep = infer_ep;
  m.infer_tp = 1;
  m.rollout_first_rank = train_ep * train_dp;
  m.gpus_per_node = 8;
  return m;
}

std::vector<ClusterCase> Cases() {
  return {
      // Kimi-K2 (planner/moe_layout.cc), trainer EP 64 x DP 4 on 256 H100, rollout 4 x EP 32 on 128.
      {"kimi-k2 256 h100 -> 4x ep32 on 128 h100", Shape(61, 384, 7168, 2048, 64, 4, 4, 32), {kNvlink, 3.35e12, kNic}},
      // Qwen3-235B-A22B-sized experts (94 layers x 128, hidden 4096, width 1536), 4x8 -> 4x8.
      {"qwen3-235b-sized 32 h100 -> 4x ep8 on 32 h100",
       Shape(94, 128, 4096, 1536, 8, 4, 4, 8),
       {kNvlink, 3.35e12, kNic}},
      // GLM-4.5-sized experts (92 layers x 160, hidden 5120, width 1536), 64 -> 2x16 H200.
      {"glm-sized 64 h200 -> 2x ep16 on 32 h200", Shape(92, 160, 5120, 1536, 16, 4, 2, 16), {kNvlink, 4.8e12, kNic}},
  };
}

int Run(const ClusterCase& c, bool relay) {
  const planner::PlanInput input = planner::MoeLayout(c.shape);
  planner::StreamedStageBytes bytes(input);
  const auto start = std::chrono::steady_clock::now();
  auto plan = planner::StreamPlan(input, *planner::LocalFirstLeastLoaded(), planner::PlanOptions{relay},
                                  [&](absl::Span<const planner::Segment> made) {
                                    bytes.Add(made);
                                    return absl::OkStatus();
                                  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.name, std::string(plan.status().message()).c_str());
    return 1;
  }
  const int64_t segments = bytes.segments();
  const auto stages = bytes.Finish(*plan);
  const int32_t first = c.shape.rollout_first_rank;
  const std::vector<planner::RankStats> ranks = planner::SumStages(stages, plan->num_ranks);
  int64_t into_rollout = 0, busiest_into = 0, out_of_trainer = 0, busiest_out = 0;
  for (int32_t r = 0; r < plan->num_ranks; ++r) {
    if (r >= first) {
      into_rollout += ranks[r].network_received_bytes;
      busiest_into = std::max(busiest_into, ranks[r].network_received_bytes);
    } else {
      out_of_trainer += ranks[r].network_sent_bytes;
      busiest_out = std::max(busiest_out, ranks[r].network_sent_bytes);
    }
  }
  int64_t model_bytes = 0;
  for (const planner::TensorLayouts& t : input.tensors) {
    model_bytes += planner::NumElements(t.shape) * planner::ElementBytes(t.target_dtype);
  }
  const int32_t rollout_gpus = plan->num_ranks - first;
  const double model_floor =
      static_cast<double>(model_bytes) * c.shape.replicas / rollout_gpus / c.bandwidths.network_bytes_per_s;
  const double even_into = static_cast<double>(into_rollout) / rollout_gpus;
  const double even_out = static_cast<double>(out_of_trainer) / first;
  std::printf(
      "{\"case\":\"%s\",\"relay\":%s,\"tensors\":%zu,\"gpus\":%d,\"segments\":%lld,\"plan_s\":%.1f,"
      "\"bytes_into_rollout\":%lld,\"busiest_nic_in\":%lld,\"busiest_over_even_in\":%.4f,"
      "\"busiest_nic_out\":%lld,\"busiest_over_even_out\":%.4f,\"model_bytes\":%lld,\"model_floor_s\":%.3f,"
      "\"physical_floor_s\":%.3f,\"planned_floor_s\":%.3f,\"stages\":%d}\n",
      c.name, relay ? "true" : "false", input.tensors.size(), plan->num_ranks, static_cast<long long>(segments),
      seconds, static_cast<long long>(into_rollout), static_cast<long long>(busiest_into), busiest_into / even_into,
      static_cast<long long>(busiest_out), busiest_out / even_out, static_cast<long long>(model_bytes), model_floor,
      even_into / c.bandwidths.network_bytes_per_s, planner::CostFloorSeconds(stages, c.bandwidths), plan->stages);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace shardsync::bench

int main(int argc, char** argv) {
  std::vector<std::string> wanted;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) != "--case") {
      std::fprintf(stderr, "usage: cluster_plan [--case NAME]...  (cases whose name starts with NAME)\n");
      return 2;
    }
    wanted.push_back(argv[i + 1]);
  }
  int failures = 0;
  for (const auto& c : shardsync::bench::Cases()) {
    bool run = wanted.empty();
    for (const std::string& prefix : wanted) run = run || std::string(c.name).rfind(prefix, 0) == 0;
    if (!run) continue;
    for (bool relay : {false, true}) failures += shardsync::bench::Run(c, relay);
  }
  return failures == 0 ? 0 : 1;
}

// `shardsyncctl plan`: plans a layout spec (or a preset model) without moving data and
// prints the plan's report as `explain` does (v1.ExplainResponse, without a layout
// epoch): what each rank sends, receives and copies, and the cost floor.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "planner/relay.h"

namespace shardsync::cli {

struct PlanCommandConfig {
  std::string spec_path;  // a layout spec file; or a preset model below
  std::string model;      // "qwen3-8b", "kimi-k2-sized", ...
  bool fused = false;
  int zero_stage = 3;
  int dp = 8;        // DP ranks 0..dp-1
  int tp = 4;        // TP size of each replica
  int replicas = 2;  // replicas over ranks rollout_rank..rollout_rank+tp*replicas-1
  int rollout_rank = 0;
  int ep = 8;          // a mixture of experts: the trainer's EP (its ranks ep * dp)
  int rollout_ep = 8;  // ... and each replica's (its ranks rollout_ep * tp)
  int layers = 0;      // ... its first layers only (0: all)
  int64_t staging_bytes = int64_t{128} << 20;
  double link_gbps = 360;     // GB/s, one direction of a rank's link within its node
  double memory_gbps = 4200;  // GB/s, device memory read + write
  double network_gbps = 50;   // GB/s, one direction of a rank's share of the network
  int ranks_per_node = 0;     // 0: every rank on one node
  planner::RelayMode relay = planner::RelayMode::kAuto;
  std::string policy = "least_loaded";
  bool json = false;
  bool links = false;  // every link's bytes too
};

// Returns the process exit code: 0 planned, 3 refused (bad input).
int RunPlanCommand(const PlanCommandConfig& config, std::ostream& out, std::ostream& err);

}  // namespace shardsync::cli

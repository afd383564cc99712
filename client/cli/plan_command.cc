#include "client/cli/plan_command.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/format.h"
#include "client/cli/report.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "daemon/common/plan_report.h"
#include "planner/cost.h"
#include "planner/known_models.h"
#include "planner/model_layout.h"
#include "planner/moe_layout.h"
#include "planner/plan.h"
#include "planner/relay.h"
#include "spec/layout_spec.h"

namespace shardsync::cli {
namespace {

bool IsMoePreset(const std::string& model) {
  const std::vector<std::string> names = planner::MoePresetNames();
  return std::find(names.begin(), names.end(), model) != names.end();
}

absl::StatusOr<planner::PlanInput> LoadMoe(const PlanCommandConfig& c, std::string* label) {
  planner::MoeShape shape;
  shape.train_ep = c.ep;
  shape.train_dp = c.dp;
  shape.replicas = c.replicas;
  shape.infer_ep = c.rollout_ep;
  shape.infer_tp = c.tp;
  shape.rollout_first_rank = c.rollout_rank;
  shape.gpus_per_node = c.ranks_per_node;
  SHARDSYNC_ASSIGN_OR_RETURN(shape, planner::MoePreset(c.model, shape));
  if (c.layers > 0) shape.layers = std::min<int64_t>(shape.layers, c.layers);
  SHARDSYNC_RETURN_IF_ERROR(planner::CheckMoeShape(shape));
  const int64_t last_rank =
      std::max<int64_t>(int64_t{c.ep} * c.dp, int64_t{c.rollout_rank} + int64_t{c.replicas} * c.rollout_ep * c.tp) - 1;
  if (last_rank >= kMaxWorld) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", last_rank, " is past the world's limit of ", kMaxWorld));
  }
  *label = absl::StrCat(c.model, " ", shape.layers, " layers, ep", c.ep, "xdp", c.dp, " -> ", c.replicas, "x(ep",
                        c.rollout_ep, "xtp", c.tp, ")",
                        c.rollout_rank > 0 ? absl::StrCat(" from rank ", c.rollout_rank) : "",
                        c.ranks_per_node > 0 ? absl::StrCat(", ", c.ranks_per_node, " ranks per node") : "");
  return planner::MoeLayout(shape);
}

absl::StatusOr<planner::PlanInput> LoadInput(const PlanCommandConfig& c, std::string* label) {
  if (c.spec_path.empty() && IsMoePreset(c.model)) return LoadMoe(c, label);
  v1::LayoutSpec spec;
  if (!c.spec_path.empty()) {
    SHARDSYNC_ASSIGN_OR_RETURN(spec, spec::ReadLayoutSpecFile(c.spec_path));
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
    *label =
        absl::StrCat(c.model, " zero", c.zero_stage, "x", c.dp, " -> tp", c.tp, "x", c.replicas,
                     c.rollout_rank > 0 ? absl::StrCat(" from rank ", c.rollout_rank) : "", c.fused ? " fused" : "");
  }
  spec::BufferIds ids;
  auto input = spec::ToPlanInput(spec, ids);
  if (!input.ok() || c.ranks_per_node == 0) return input;
  const int32_t ranks = planner::NumRanks(*input);
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
  // Streamed, as the coordinator plans: no segment kept, so any model plans here.
  auto planned = planner::PlanStreamed(*input, *policy, c.relay, bandwidths, planner::kDefaultScratchBytes,
                                       c.staging_bytes, planner::NumRanks(*input),
                                       [](absl::Span<const planner::Segment>) { return absl::OkStatus(); });
  const auto t1 = Clock::now();
  if (!planned.ok()) {
    err << "shardsyncctl plan: " << planned.status().message() << "\n";
    return 3;
  }
  const v1::ExplainResponse report =
      daemon::MakePlanReport(planned->plan, planned->stats, planned->digest, planned->floors, bandwidths, c.links);
  if (c.json) {
    PrintJson(report, out);
    return 0;
  }
  PrintPlanReport(
      report,
      absl::StrFormat("plan of %s (policy %s, staging %s per peer)", label, policy->name(), Bytes(c.staging_bytes)),
      c.links, out);
  out << absl::StrFormat("\nplanned in %.2f ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
  return 0;
}

}  // namespace shardsync::cli

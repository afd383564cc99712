// The report of one plan, v1.ExplainResponse: what the coordinator's Explain answers
// and what `shardsyncctl plan` prints, so both say the same with the same names.
#pragma once

#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "planner/cost.h"
#include "planner/plan.h"
#include "proto/shardsync.pb.h"

namespace shardsync::daemon {

// The counts, the bytes per rank and per link, and the floor at `bandwidths` (with
// those speeds in GB/s) of `plan` (its segments not read) and its `stats` (with chunks
// and rounds: planner::StreamedPlan's, or ComputeStats with schedules). `digest` is the plan's
// (planner::PlanDigest); `floors` the floors without and with the relay that chose it
// ({0, 0}: none compared). layout_epoch stays unset: it is the coordinator's, not the plan's.
// Every link of `stats` with its planned bytes (no path: the coordinator's to say).
std::vector<v1::LinkBytes> LinksOf(const planner::PlanStats& stats);

// With `links`, every link of LinksOf too.
v1::ExplainResponse MakePlanReport(const planner::Plan& plan, const planner::PlanStats& stats, absl::string_view digest,
                                   std::pair<double, double> floors, const planner::Bandwidths& bandwidths, bool links);

}  // namespace shardsync::daemon

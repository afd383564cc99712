// Fuzz target: any bytes as a layout spec (JSON). The reader and the planner must either
// refuse it with a status or plan it; a plan of a small input is then executed by the
// reference executor and must sync every element exactly. Crashes, sanitizer reports
// and wrong syncs are the findings.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "planner/plan.h"
#include "planner/schedule.h"
#include "spec/layout_spec.h"
#include "tests/planner/reference_executor.h"
#include "tests/planner/sync_check.h"

namespace {

// Inputs larger than this are valid but only slow to fuzz: read, not planned.
constexpr int64_t kMaxBytes = int64_t{1} << 20;
constexpr int32_t kMaxRanks = 64;

bool SmallEnough(const shardsync::planner::PlanInput& input) {
  int64_t bytes = 0;
  for (const auto& b : input.buffers) {
    if (b.holder.rank >= kMaxRanks) return false;
    bytes += b.bytes;
    if (bytes > kMaxBytes) return false;
  }
  return true;
}

[[noreturn]] void Finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "FINDING: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardsync;
  const absl::StatusOr<v1::LayoutSpec> spec =
      spec::ParseLayoutSpecJson(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!spec.ok()) return 0;
  if (spec->has_model()) {  // presets expand to real models: keep them small
    const v1::ModelLayout& model = spec->model();
    if (!model.preset().empty() || model.tensors_size() > 64) return 0;
  }
  spec::BufferIds ids;
  const absl::StatusOr<planner::PlanInput> input = spec::ToPlanInput(*spec, ids);
  if (!input.ok() || !SmallEnough(*input)) return 0;
  const auto policy = planner::LocalFirstLeastLoaded();
  const absl::StatusOr<planner::Plan> plan = planner::MakePlan(*input, *policy);
  if (!plan.ok()) return 0;  // refused: a target not covered, a mismatch
  const int64_t staging = 64 + static_cast<int64_t>(size % 4096);
  const absl::StatusOr<std::vector<planner::Schedule>> schedules = planner::MakeSchedules(*plan, staging);
  if (!schedules.ok())
    Finding("a plan the planner made cannot be scheduled", std::string(schedules.status().message()));

  testing::HostBuffers buffers = testing::AllocateBuffers(*input);
  std::mt19937_64 rng(size);
  const testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
  const testing::HostBuffers before = buffers;
  const absl::StatusOr<testing::ExecutionStats> executed = testing::Execute(*plan, *schedules, staging, buffers);
  if (!executed.ok()) Finding("the schedule does not execute", std::string(executed.status().message()));
  const std::vector<std::string> errors = testing::CheckSync(*input, values, before, buffers);
  if (!errors.empty()) Finding("the sync is not exact", errors.front());
  return 0;
}

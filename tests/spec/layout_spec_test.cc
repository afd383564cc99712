// The layout spec reader: examples plan and sync; malformed specs are refused clearly.
#include <catch2/catch.hpp>

#include <random>

#include "planner/plan.h"
#include "planner/schedule.h"
#include "spec/layout_spec.h"
#include "tests/planner/reference_executor.h"
#include "tests/planner/sync_check.h"

namespace shardsync::spec {
namespace {

using Catch::Matchers::Contains;

absl::StatusOr<planner::PlanInput> FromJson(const std::string& json) {
  auto spec = ParseLayoutSpecJson(json);
  if (!spec.ok()) return spec.status();
  BufferIds ids;
  return ToPlanInput(*spec, ids);
}

std::string ErrorOf(const std::string& json) {
  auto input = FromJson(json);
  REQUIRE_FALSE(input.ok());
  return std::string(input.status().message());
}

TEST_CASE("the explicit example spec syncs every element") {
  auto spec = ReadLayoutSpecFile("examples/explicit-two-ranks.json");
  REQUIRE(spec.ok());
  BufferIds ids;
  auto input = ToPlanInput(*spec, ids);
  REQUIRE(input.ok());
  CHECK(input->tensors.at(0).target.placements.at(1).strides == planner::Index{4, 1});
  auto plan = planner::MakePlan(*input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  auto schedules = planner::MakeSchedules(*plan, 8);
  REQUIRE(schedules.ok());
  std::mt19937_64 rng(1);
  testing::HostBuffers buffers = testing::AllocateBuffers(*input);
  const testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
  const testing::HostBuffers before = buffers;
  REQUIRE(testing::Execute(*plan, *schedules, 8, buffers).ok());
  CHECK(testing::CheckSync(*input, values, before, buffers).empty());
}

TEST_CASE("preset model specs expand to every tensor of the model") {
  auto spec = ReadLayoutSpecFile("examples/qwen3-8b-zero3-tp4x2.json");
  REQUIRE(spec.ok());
  BufferIds ids;
  auto input = ToPlanInput(*spec, ids);
  REQUIRE(input.ok());
  CHECK(input->tensors.size() == 399);
  CHECK(input->buffers.size() == 16);  // a flat and an arena on each of 8 ranks

  auto fused = ReadLayoutSpecFile("examples/qwen3-0.6b-zero3-tp2x2-fused.json");
  REQUIRE(fused.ok());
  auto fused_input = ToPlanInput(*fused, ids);
  REQUIRE(fused_input.ok());
  CHECK(fused_input->tensors.size() == 1 + 28 * 11 + 1);  // lm_head is tied
  CHECK(planner::MakePlan(*fused_input, *planner::LocalFirstLeastLoaded()).ok());
}

TEST_CASE("a spec with an unknown key, an unknown preset or a bad dtype is refused") {
  CHECK_THAT(ErrorOf(R"({"modle": {}})"), Contains("modle"));
  CHECK_THAT(ErrorOf(R"({"model": {"preset": "gpt-5", "zero_stage": 3, "dp_ranks": [0]}})"),
             Contains("unknown model 'gpt-5'"));
  CHECK_THAT(ErrorOf(R"({"sources": [{"name": "w", "shape": [2]}]})"), Contains("tensor 'w'") &&
                                                                           Contains("unsupported dtype"));
  CHECK_THAT(ErrorOf("{not json"), Contains("layout spec"));
  CHECK_THAT(ErrorOf("{}"), Contains("no tensor"));
  CHECK_FALSE(ReadLayoutSpecFile("examples/does-not-exist.json").ok());
}

TEST_CASE("a target whose name or shape does not match a source is refused") {
  const std::string buffers = R"("buffers": [{"rank": 0, "name": "b", "bytes": 64}, {"rank": 1, "name": "b", "bytes": 64}])";
  const std::string source =
      R"("sources": [{"name": "w", "shape": [4], "dtype": "BFLOAT16", "placements": [{"rank": 0, "buffer": "b", "box": {"lo": [0], "hi": [4]}}]}])";
  CHECK_THAT(ErrorOf("{" + buffers + "," + source +
                     R"(, "targets": [{"name": "x", "shape": [4], "dtype": "BFLOAT16"}]})"),
             Contains("'x'") && Contains("no source"));
  CHECK_THAT(ErrorOf("{" + buffers + "," + source +
                     R"(, "targets": [{"name": "w", "shape": [5], "dtype": "BFLOAT16"}]})"),
             Contains("shape mismatch"));
}

}  // namespace
}  // namespace shardsync::spec

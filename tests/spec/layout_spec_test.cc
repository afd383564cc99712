// The layout spec reader: examples plan and sync; malformed specs are refused clearly.
#include "spec/layout_spec.h"

#include <catch2/catch.hpp>
#include <random>

#include "common/status_macros.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "planner/validate.h"
#include "tests/planner/reference_executor.h"
#include "tests/planner/sync_check.h"

namespace shardsync::spec {
namespace {

using Catch::Matchers::Contains;

absl::StatusOr<planner::PlanInput> FromJson(const std::string& json) {
  SHARDSYNC_ASSIGN_OR_RETURN(auto spec, ParseLayoutSpecJson(json));
  BufferIds ids;
  return ToPlanInput(spec, ids);
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
  auto schedules = planner::MakeSchedules(*plan, 32);
  REQUIRE(schedules.ok());
  std::mt19937_64 rng(1);
  testing::HostBuffers buffers = testing::AllocateBuffers(*input);
  const testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
  const testing::HostBuffers before = buffers;
  REQUIRE(testing::Execute(*plan, *schedules, 32, buffers).ok());
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
             Contains("unknown model 'gpt-5' (known: qwen3-0.6b, qwen3-1.7b, qwen3-8b)"));
  CHECK_THAT(ErrorOf(R"({"sources": [{"name": "w", "shape": [2]}]})"),
             Contains("tensor 'w'") && Contains("unsupported dtype"));
  CHECK_THAT(ErrorOf("{not json"), Contains("layout spec"));
  CHECK_THAT(ErrorOf("{}"), Contains("no tensor"));
  CHECK_FALSE(ReadLayoutSpecFile("examples/does-not-exist.json").ok());
}

TEST_CASE("a flat placement becomes the boxes of its row-major stretch; one outside the tensor is refused") {
  auto input = FromJson(R"({
    "buffers": [{"rank": 0, "name": "flat", "bytes": 64}, {"rank": 1, "name": "arena", "bytes": 64}],
    "sources": [{"name": "w", "shape": [3, 4], "dtype": "BFLOAT16",
                 "flat_placements": [{"rank": 0, "buffer": "flat", "base": 5, "begin": 0, "end": 12}]}],
    "targets": [{"name": "w", "shape": [3, 4], "dtype": "BFLOAT16", "placements": [
                 {"rank": 1, "buffer": "arena", "box": {"lo": [0, 0], "hi": [3, 4]}}]}]})");
  REQUIRE(input.ok());
  REQUIRE(input->tensors[0].source.placements.size() == 1);
  CHECK(input->tensors[0].source.placements[0].base == 5);
  // [3, 9) of a [3, 4] tensor: row 0 column 3, row 1, row 2 column 0.
  v1::TensorLayout layout;
  layout.set_name("w");
  layout.add_shape(3);
  layout.add_shape(4);
  layout.set_dtype(v1::BFLOAT16);
  v1::FlatPlacement* flat = layout.add_flat_placements();
  flat->set_buffer("flat");
  flat->set_base(2);
  flat->set_begin(3);
  flat->set_end(9);
  BufferIds ids;
  auto side = ToTensorSide(layout, ids);
  REQUIRE(side.ok());
  REQUIRE(side->layout.placements.size() == 3);
  CHECK(side->layout.placements[0].box == planner::Box{{0, 3}, {1, 4}});
  CHECK(side->layout.placements[0].base == 2);
  CHECK(side->layout.placements[1].box == planner::Box{{1, 0}, {2, 4}});
  CHECK(side->layout.placements[1].base == 3);
  CHECK(side->layout.placements[2].base == 7);
  auto outside = FromJson(R"({"sources": [{"name": "w", "shape": [3, 4], "dtype": "BFLOAT16",
                 "flat_placements": [{"rank": 0, "buffer": "flat", "begin": 3, "end": 13}]}]})");
  CHECK_THAT(std::string(outside.status().message()), Contains("tensor 'w'") && Contains("[3, 13)"));
}

// A 4x4 bf16 source on rank 0 and a target of `target_box_and_strides` on rank 1, each in
// its own 32-byte buffer.
std::string OneTargetJson(const std::string& target_placement) {
  return R"({"buffers": [{"rank": 0, "name": "flat", "bytes": 32}, {"rank": 1, "name": "arena", "bytes": 32}],
    "sources": [{"name": "w", "shape": [4, 4], "dtype": "BFLOAT16", "placements": [
                 {"rank": 0, "buffer": "flat", "box": {"lo": [0, 0], "hi": [4, 4]}}]}],
    "targets": [{"name": "w", "shape": [4, 4], "dtype": "BFLOAT16", "placements": [)" +
         target_placement + "]}]}";
}

TEST_CASE("a target placement that maps two elements to one place is refused, naming tensor, buffer and rank") {
  for (const std::string strides : {"[0, 1]", "[2, 1]", "[1, 1]", "[4, 0]"}) {
    INFO(strides);
    auto input = FromJson(OneTargetJson(R"({"rank": 1, "buffer": "arena", "box": {"lo": [0, 0], "hi": [4, 4]},
                                            "strides": )" +
                                        strides + "}"));
    REQUIRE(input.ok());
    const absl::Status status = planner::ValidatePlanInput(*input);
    CHECK_THAT(std::string(status.message()), Contains("tensor 'w'") && Contains("buffer 'arena' on rank 1") &&
                                                  Contains("maps two elements to one place"));
  }
  for (const std::string strides : {"[4, 1]", "[1, 4]", "[8, 2]"}) {  // row-major, column-major, a strided slice
    INFO(strides);
    auto input = FromJson(OneTargetJson(R"({"rank": 1, "buffer": "arena", "box": {"lo": [0, 0], "hi": [4, 4]},
                                            "strides": )" +
                                        strides + "}"));
    REQUIRE(input.ok());
    const absl::Status status = planner::ValidatePlanInput(*input);
    if (strides == "[8, 2]") {  // one-to-one, but past the 32-byte buffer
      CHECK_THAT(std::string(status.message()), Contains("needs 62 bytes"));
    } else {
      CHECK(status.ok());
    }
  }
}

TEST_CASE("a fill of a negative or oversized shape is refused, naming its buffer") {
  for (const planner::Index& shape : {planner::Index{-3, -5}, planner::Index{1, int64_t{1} << 31}}) {
    auto input = FromJson(OneTargetJson(R"({"rank": 1, "buffer": "arena", "box": {"lo": [0, 0], "hi": [4, 4]}})"));
    REQUIRE(input.ok());
    input->tensors[0].target.fills.push_back(
        planner::Fill{input->tensors[0].target.placements[0].holder, 0, shape, {1, 1}});
    CHECK_THAT(std::string(planner::ValidatePlanInput(*input).message()),
               Contains("a fill in buffer 'arena' on rank 1 has shape"));
  }
}

TEST_CASE("errors name a buffer as registered, not by its index") {
  auto twice = FromJson(OneTargetJson(R"({"rank": 1, "buffer": "arena", "box": {"lo": [0, 0], "hi": [4, 4]}})"));
  REQUIRE(twice.ok());
  twice->buffers.push_back(twice->buffers[0]);  // "flat" on rank 0 once more
  CHECK_THAT(std::string(planner::ValidatePlanInput(*twice).message()),
             Contains("buffer 'flat' on rank 0 is registered twice"));
  auto uncovered = FromJson(OneTargetJson(R"({"rank": 1, "buffer": "arena", "box": {"lo": [0, 0], "hi": [4, 4]}})"));
  REQUIRE(uncovered.ok());
  uncovered->tensors[0].source.placements[0].box.hi = {2, 4};  // rows 2 and 3 have no source
  const auto plan = planner::MakePlan(*uncovered, *planner::LocalFirstLeastLoaded());
  CHECK_THAT(std::string(plan.status().message()),
             Contains("tensor 'w'") && Contains("buffer 'arena' on rank 1") && Contains("has no source"));
}

TEST_CASE("a shape whose element count overflows is refused as such, before any count") {
  for (const char* shape : {"[1099511627776, 1099511627776]", "[2147483647, 2147483647, 2147483647]"}) {
    INFO(shape);
    const std::string error =
        ErrorOf(std::string(R"({"sources": [{"name": "w", "dtype": "BFLOAT16", "shape": )") + shape +
                R"(, "flat_placements": [{"rank": 0, "buffer": "flat", "begin": 0, "end": 4}]}]})");
    CHECK_THAT(error, Contains("tensor 'w'") && !Contains("lies outside"));
    CHECK_THAT(error, Contains("at most 2147483647") || Contains("more than 2^62 elements"));
  }
}

TEST_CASE("a target whose name or shape does not match a source is refused") {
  const std::string buffers =
      R"("buffers": [{"rank": 0, "name": "b", "bytes": 64}, {"rank": 1, "name": "b", "bytes": 64}])";
  const std::string source =
      R"("sources": [{"name": "w", "shape": [4], "dtype": "BFLOAT16", "placements": [{"rank": 0, "buffer": "b", "box": {"lo": [0], "hi": [4]}}]}])";
  CHECK_THAT(
      ErrorOf("{" + buffers + "," + source + R"(, "targets": [{"name": "x", "shape": [4], "dtype": "BFLOAT16"}]})"),
      Contains("'x'") && Contains("no source"));
  CHECK_THAT(
      ErrorOf("{" + buffers + "," + source + R"(, "targets": [{"name": "w", "shape": [5], "dtype": "BFLOAT16"}]})"),
      Contains("shape mismatch"));
}

TEST_CASE(
    "inputs the fuzzer found are refused: a box without hi, sources sharing bytes, a target over a source, a huge "
    "extent") {
  constexpr char kTwoRanks[] =
      R"({"buffers": [{"rank": 0, "name": "flat", "bytes": 64}, {"rank": 1, "name": "flat", "bytes": 64},
      {"rank": 0, "name": "shard", "bytes": 32}, {"rank": 1, "name": "shard", "bytes": 32}],
    "targets": [{"name": "w", "shape": [4, 8], "dtype": "BFLOAT16", "placements": [
      {"rank": 0, "buffer": "shard", "base": 0, "box": {"lo": [0, 0], "hi": [4, 4]}},
      {"rank": 1, "buffer": "shard", "base": 0, "box": {"lo": [0, 4], "hi": [4, 8]}}]}],
    "sources": [{"name": "w", "shape": [4, 8], "dtype": "BFLOAT16", "placements": [
      {"rank": 1, "buffer": "flat", "base": 0, "box": {"lo": [0, 0], "hi": [2, 8]}},
      {"rank": 1, "buffer": "flat", "base": )";
  CHECK_THAT(ErrorOf(std::string(kTwoRanks) + R"(1, "box": {"lo": [2, 8]}}]}]})"),
             Contains("tensor 'w'") && Contains("2 lo and 0 hi"));
  const auto validated = [&](const std::string& rest) {
    auto input = FromJson(std::string(kTwoRanks) + rest);
    REQUIRE(input.ok());
    return planner::ValidatePlanInput(*input);
  };
  const absl::Status aliased = validated(R"(0, "box": {"lo": [2, 0], "hi": [4, 8]}}]}]})");
  CHECK_THAT(std::string(aliased.message()),
             Contains("the source of tensor 'w' and the source of tensor 'w' overlap") && Contains("rank 1"));
  // A target on rank 1 written into the source buffer "flat" while it is read.
  auto written = FromJson(R"({"buffers": [{"rank": 0, "name": "a", "bytes": 64}, {"rank": 1, "name": "b", "bytes": 64}],
    "sources": [{"name": "w", "shape": [4, 8], "dtype": "BFLOAT16", "placements": [
      {"rank": 0, "buffer": "a", "base": 0, "box": {"lo": [0, 0], "hi": [4, 8]}}]}],
    "targets": [{"name": "w", "shape": [4, 8], "dtype": "BFLOAT16", "placements": [
      {"rank": 0, "buffer": "a", "base": 4, "box": {"lo": [0, 0], "hi": [1, 8]}},
      {"rank": 1, "buffer": "b", "base": 0, "box": {"lo": [0, 0], "hi": [4, 8]}}]}]})");
  REQUIRE(written.ok());
  CHECK_THAT(std::string(planner::ValidatePlanInput(*written).message()),
             Contains("the source of tensor 'w' and the target of tensor 'w' overlap in buffer") && Contains("rank 0"));
  // A model tensor with a huge extent: refused before any offset is summed (UB before).
  CHECK_THAT(ErrorOf(R"({"model": {"tensors": [{"name": "cube", "shape": [1, 7777777777777777777], "style": "COLUMN"}],
      "zero_stage": 3, "dp_ranks": [0, 1], "replicas": [{"ranks": [0, 1]}]}})"),
             Contains("model tensor 'cube'") && Contains("larger than 2^50"));
  CHECK(validated(R"(16, "box": {"lo": [2, 0], "hi": [4, 8]}}]}]})").ok());  // base in elements: after rows 0-1
}

}  // namespace
}  // namespace shardsync::spec

// The block quantizer against the test oracle (tests/executor/reference_quantizer.h),
// and the planner's checks and groups for block-quantized targets.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/block_quantize.h"
#include "planner/cost.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "tests/executor/reference_quantizer.h"

namespace shardsync::executor {
namespace {

using Catch::Matchers::Contains;
using planner::DType;
using planner::Holder;
using planner::Index;

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

TEST_CASE("float8 e4m3 conversion: every bfloat16 value, every tie and random floats match the nearest-code search") {
  int checked = 0;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float x = FromBits(bits << 16);
    if (!std::isfinite(x)) continue;
    INFO("bfloat16 bits " << bits);
    REQUIRE(int{Float32ToFloat8E4M3(x)} == int{testing::NearestFloat8E4M3(x)});
    ++checked;
  }
  CHECK(checked == 65536 - 256);  // all but the NaNs and infinities of both signs
  // Halfway between neighbours: ties go to the even code.
  for (int code = 0; code < 0x7e; ++code) {
    const float mid = (testing::DecodeFloat8E4M3(code) + testing::DecodeFloat8E4M3(code + 1)) / 2;
    INFO("between codes " << code << " and " << code + 1);
    const uint8_t even = static_cast<uint8_t>(code % 2 == 0 ? code : code + 1);
    REQUIRE(int{Float32ToFloat8E4M3(mid)} == even);
    REQUIRE(int{Float32ToFloat8E4M3(-mid)} == (even | 0x80));
  }
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> wide(-600, 600);
  std::uniform_real_distribution<float> tiny(-0.02f, 0.02f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i % 2 == 0 ? wide(rng) : tiny(rng);
    INFO("x = " << x);
    REQUIRE(int{Float32ToFloat8E4M3(x)} == int{testing::NearestFloat8E4M3(x)});
  }
  CHECK(Float32ToFloat8E4M3(448) == 0x7e);
  CHECK(Float32ToFloat8E4M3(1e30f) == 0x7e);
  CHECK(Float32ToFloat8E4M3(-1e30f) == 0xfe);
  CHECK(Float32ToFloat8E4M3(std::ldexp(1.0f, -10)) == 0x00);  // half the smallest subnormal: to even (zero)
}

// bfloat16 bits of random values: per 128 x 128 block a magnitude from 2^-140 (bfloat16
// subnormals) to 2^20, about a tenth zeros, and some blocks all zero.
std::vector<uint16_t> RandomBlockValues(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  std::vector<uint16_t> values(rows * cols);
  std::uniform_int_distribution<int> exponent(-140, 20);
  std::uniform_real_distribution<float> unit(-1, 1);
  for (int64_t br = 0; br < rows; br += 128) {
    for (int64_t bc = 0; bc < cols; bc += 128) {
      const bool zero_block = rng() % 5 == 0;
      const int e = exponent(rng);
      for (int64_t r = br; r < std::min(rows, br + 128); ++r) {
        for (int64_t c = bc; c < std::min(cols, bc + 128); ++c) {
          const float x = zero_block || rng() % 10 == 0 ? 0.0f : std::ldexp(unit(rng), e);
          uint32_t bits;
          std::memcpy(&bits, &x, 4);
          values[r * cols + c] = static_cast<uint16_t>(bits >> 16);  // truncated: any bfloat16 will do
        }
      }
    }
  }
  return values;
}

TEST_CASE("QuantizeHost writes every element and scale as the oracle does, and nothing beside them") {
  std::mt19937_64 rng(11);
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{300, 200}, {128, 128}, {1, 5}, {257, 1}}) {
    INFO(rows << " x " << cols);
    const std::vector<uint16_t> values = RandomBlockValues(rows, cols, rng);
    planner::QuantizeOp op;
    op.rows = rows;
    op.cols = cols;
    op.scratch_base = 64;
    op.target_base = 3;
    op.target_row_stride = cols + 7;
    op.scale_base = 2;
    op.scale_row_stride = planner::ScaleBlocks(cols) + 1;
    std::vector<uint8_t> scratch(2 * (64 + rows * cols));
    std::memcpy(scratch.data() + 128, values.data(), 2 * values.size());
    const uint8_t poison = 0xa5;
    std::vector<uint8_t> target(3 + rows * (cols + 7), poison);
    std::vector<uint8_t> scale(4 * (2 + planner::ScaleBlocks(rows) * op.scale_row_stride), poison);
    QuantizeHost(op, scratch.data(), target.data(), scale.data());
    std::vector<bool> written_target(target.size()), written_scale(scale.size());
    for (int64_t br = 0; br < planner::ScaleBlocks(rows); ++br) {
      for (int64_t bc = 0; bc < planner::ScaleBlocks(cols); ++bc) {
        float amax = 0;
        for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
          for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
            amax = std::max(amax, std::fabs(testing::BFloat16Value(values[r * cols + c])));
          }
        }
        const float expected_scale = testing::ReferenceBlockScale(amax);
        const size_t at = 4 * (2 + br * op.scale_row_stride + bc);
        float got_scale;
        std::memcpy(&got_scale, scale.data() + at, 4);
        REQUIRE(got_scale == expected_scale);
        for (int k = 0; k < 4; ++k) written_scale[at + k] = true;
        for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
          for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
            const size_t t = 3 + r * op.target_row_stride + c;
            INFO("element " << r << ", " << c);
            REQUIRE(int{target[t]} ==
                    int{testing::NearestFloat8E4M3(testing::BFloat16Value(values[r * cols + c]) / expected_scale)});
            written_target[t] = true;
          }
        }
      }
    }
    for (size_t i = 0; i < target.size(); ++i) {
      if (!written_target[i]) REQUIRE(target[i] == poison);
    }
    for (size_t i = 0; i < scale.size(); ++i) {
      if (!written_scale[i]) REQUIRE(scale[i] == poison);
    }
  }
}

TEST_CASE(
    "a block holding infinities and NaN: they saturate and stay NaN, the other elements quantize as without them") {
  std::mt19937_64 rng(13);
  constexpr int64_t kSide = 128;
  std::vector<uint16_t> values = RandomBlockValues(kSide, kSide, rng);
  values[3 * kSide + 5] = 0x7f80;      // +Inf
  values[100 * kSide + 100] = 0xff80;  // -Inf
  values[7 * kSide + 7] = 0x7fc1;      // NaN
  values[9 * kSide + 1] = 0xffc0;      // -NaN
  planner::QuantizeOp op;
  op.rows = op.cols = kSide;
  op.target_row_stride = kSide;
  op.scale_row_stride = 1;
  std::vector<uint8_t> scratch(2 * values.size());
  std::memcpy(scratch.data(), values.data(), scratch.size());
  std::vector<uint8_t> target(values.size(), 0xa5);
  float scale = 0;
  QuantizeHost(op, scratch.data(), target.data(), reinterpret_cast<uint8_t*>(&scale));
  float amax = 0;
  for (uint16_t v : values) {
    const float x = testing::BFloat16Value(v);
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  }
  REQUIRE(amax > 0);
  CHECK(scale == testing::ReferenceBlockScale(amax));
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("element " << i);
    REQUIRE(int{target[i]} == int{testing::ReferenceFloat8(testing::BFloat16Value(values[i]), scale)});
  }
  CHECK(target[3 * kSide + 5] == 0x7e);
  CHECK(target[100 * kSide + 100] == 0xfe);
  CHECK(target[7 * kSide + 7] == 0x7f);
  CHECK(target[9 * kSide + 1] == 0xff);
}

// One bfloat16 tensor of `rows` x `cols` on rank 0 (buffer 0) into a float8 target split
// by rows over ranks 0 and 1 (buffer 1), scales in buffer 2.
planner::PlanInput TwoRankQuantized(int64_t rows, int64_t cols, int tensors) {
  planner::PlanInput input;
  const int64_t numel = rows * cols;
  input.buffers.push_back({Holder{0, 0}, 2 * numel * tensors, "source"});
  const int64_t half = rows / 2;
  const int64_t blocks_per_row = planner::ScaleBlocks(cols);
  const int64_t scale_elements = planner::ScaleBlocks(half) * blocks_per_row;
  for (int32_t rank : {0, 1}) {
    input.buffers.push_back({Holder{rank, 1}, numel * tensors, "weights"});
    input.buffers.push_back({Holder{rank, 2}, 4 * scale_elements * tensors, "scales"});
  }
  for (int t = 0; t < tensors; ++t) {
    planner::TensorLayouts layouts;
    layouts.name = absl::StrCat("w", t);
    layouts.shape = Index{rows, cols};
    layouts.source_dtype = DType::kBFloat16;
    layouts.target_dtype = DType::kFloat8E4M3;
    layouts.source.placements.push_back({planner::Box{{0, 0}, {rows, cols}}, Holder{0, 0}, t * numel, Index{cols, 1}});
    for (int32_t rank : {0, 1}) {
      layouts.target.placements.push_back({planner::Box{{rank * half, 0}, {(rank + 1) * half, cols}}, Holder{rank, 1},
                                           t * half * cols, Index{cols, 1}});
      layouts.target_scales.push_back({Holder{rank, 2}, t * scale_elements, blocks_per_row});
    }
    input.tensors.push_back(layouts);
  }
  return input;
}

TEST_CASE("block-quantized targets are planned in groups within the scratch budget, one even stage each") {
  const planner::PlanInput input = TwoRankQuantized(256, 128, 5);  // a shard: 128 x 128 bfloat16, 32 KiB
  const auto policy = planner::LocalFirstLeastLoaded();
  planner::PlanOptions options;
  options.scratch_bytes = 64 << 10;  // two shards per group
  auto plan = planner::MakePlan(input, *policy, options);
  REQUIRE(plan.ok());
  CHECK(plan->stages == 5);  // groups in stages 0, 2, 4
  REQUIRE(plan->scratch.size() == 2);
  for (const planner::Buffer& b : plan->scratch) {
    CHECK(b.name == planner::kScratchBufferName);
    CHECK(b.holder.buffer == 3);  // one past every registered id
    CHECK(b.bytes == 64 << 10);
  }
  REQUIRE(plan->quantizes.size() == 10);
  for (const planner::QuantizeOp& q : plan->quantizes) {
    CHECK(q.stage == 2 * (q.tensor / 2));
    CHECK(q.scratch.rank == q.target.rank);
    CHECK(q.rows == 128);
    CHECK(q.cols == 128);
  }
  for (const planner::Segment& s : plan->segments) {
    CHECK(s.stage == 2 * (s.tensor / 2));
    CHECK(s.dst_dtype == DType::kBFloat16);  // the wire and the scratch carry bfloat16
    CHECK(s.dst.buffer == 3);
  }
  auto schedules = planner::MakeSchedules(*plan, 1 << 20);
  REQUIRE(schedules.ok());
  for (const planner::Schedule& schedule : *schedules) {
    CHECK(schedule.scratch_handoff);
    CHECK(planner::CheckChunks(*plan, schedule, 1 << 20).ok());
    int quantizes = 0;
    for (const planner::Stage& stage : schedule.stages) quantizes += static_cast<int>(stage.quantizes.size());
    CHECK(quantizes == 5);
  }
  // The floor counts the quantize pass: 2 bytes read and 1 written per element.
  const auto stages = planner::StageBytes(*plan);
  int64_t quantized = 0;
  for (const auto& stage : stages) {
    for (const planner::RankStats& r : stage) quantized += r.quantized_bytes;
  }
  CHECK(quantized == 5 * 256 * 128);
  CHECK(stages[0][1].received_bytes == 2 * 128 * 128 * 2);  // two tensors' halves, in bfloat16
  const planner::Bandwidths bw{1e9, 1e9, 1e9};
  CHECK(planner::CostFloorSeconds(stages, bw) > 0);
}

TEST_CASE("a one-row block-quantized placement with any row stride plans a row stride the agents accept") {
  planner::PlanInput input = TwoRankQuantized(2, 200, 1);  // each rank's shard: 1 x 200
  for (planner::Placement& p : input.tensors[0].target.placements) p.strides = Index{0, 1};
  auto plan = planner::MakePlan(input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  REQUIRE(plan->quantizes.size() == 2);
  for (const planner::QuantizeOp& q : plan->quantizes) CHECK(q.target_row_stride >= q.cols);  // the decoder's rule
}

TEST_CASE("block-quantized targets: bad input is refused before planning, naming the tensor") {
  const auto policy = planner::LocalFirstLeastLoaded();
  const auto refused = [&](const planner::PlanInput& input, const std::string& what, int64_t budget = 1 << 20) {
    planner::PlanOptions options;
    options.scratch_bytes = budget;
    const auto plan = planner::MakePlan(input, *policy, options);
    REQUIRE_FALSE(plan.ok());
    CHECK_THAT(std::string(plan.status().message()), Contains(what));
    return plan.status().code();
  };
  const planner::PlanInput good = TwoRankQuantized(256, 128, 1);
  REQUIRE(planner::MakePlan(good, *policy).ok());
  {
    planner::PlanInput input = good;
    input.tensors[0].target_scales.pop_back();
    refused(input, "tensor 'w0': 2 target placements but 1 sets of block scales");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].target_dtype = DType::kBFloat16;
    refused(input, "block scales are given for a bfloat16 target");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].target_scales.clear();
    refused(input, "dtype mismatch: source bfloat16, target float8_e4m3");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].source_dtype = DType::kFloat16;
    input.buffers[0].bytes *= 2;
    refused(input, "dtype mismatch: source float16");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].target_scales[1].holder = Holder{0, 2};
    refused(input, "the scales of the target on rank 1 are on rank 0");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].target_scales[0].base = 1;  // past the end of a one-block buffer
    refused(input, "tensor 'w0': block scales in buffer 'scales' on rank 0 needs 8 bytes but the buffer has 4");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].target_scales[0].holder = Holder{0, 1};  // in the float8 weights themselves
    refused(input, "'w0'");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].target.placements[0].strides = Index{1, 128};
    refused(input, "column stride 128; its columns must be contiguous");
  }
  {
    planner::PlanInput input = good;
    input.tensors[0].target.fills.push_back({Holder{0, 1}, 0, Index{1, 1}, Index{1, 1}});
    refused(input, "a block-quantized target cannot hold zero fills");
  }
  CHECK(refused(good, "tensor 'w0': its quantized targets on rank 0 need 32768 bytes", 1000) ==
        absl::StatusCode::kResourceExhausted);
  CHECK(refused(TwoRankQuantized(256, 128, planner::kMaxQuantizeGroups + 1), "more than 64 groups", 32 << 10) ==
        absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace shardsync::executor

// The plan: replica policy cases pinned from the DeepSpeed draft, and every refusal
// naming its tensor, rank and box.
#include "planner/plan.h"

#include <catch2/catch.hpp>
#include <map>

#include "planner/box.h"
#include "planner/builders.h"

namespace shardsync::planner {
namespace {

using Catch::Matchers::Contains;
using Counts = std::map<int32_t, int>;  // rank -> parameters it sends

// A 1-D tensor of `n` bf16 elements at `offset` of buffer 0 on each of `ranks`.
Layout Whole(int64_t n, const std::vector<int32_t>& ranks, int64_t offset = 0) {
  return Replicated(Index{n}, ranks, 0, std::vector<int64_t>(ranks.size(), offset));
}

PlanInput WithBuffers(int ranks, int64_t bytes) {
  PlanInput input;
  for (int r = 0; r < ranks; ++r) input.buffers.push_back(Buffer{Holder{r, 0}, bytes, ""});
  for (int r = 0; r < ranks; ++r) input.buffers.push_back(Buffer{Holder{r, 1}, bytes, ""});
  return input;
}

// The target layout `Whole` makes, but on buffer 1.
Layout WholeTarget(int64_t n, const std::vector<int32_t>& ranks, int64_t offset = 0) {
  Layout l = Whole(n, ranks, offset);
  for (Placement& p : l.placements) p.holder.buffer = 1;
  return l;
}

Counts ParamsSentBy(const Plan& plan) {
  Counts sent;
  for (const Segment& s : plan.segments) {
    if (s.src.rank != s.dst.rank) ++sent[s.src.rank];
  }
  return sent;
}

std::string PlanError(const PlanInput& input) {
  auto plan = MakePlan(input, *LocalFirstLeastLoaded());
  REQUIRE_FALSE(plan.ok());
  return std::string(plan.status().message());
}

TEST_CASE("reads of parameters held by three ranks spread evenly: two of six per holder") {
  PlanInput input = WithBuffers(4, 1024);
  for (int i = 0; i < 6; ++i) {
    input.tensors.push_back(TensorLayouts{"p" + std::to_string(i), Index{8}, DType::kBFloat16, DType::kBFloat16,
                                          Whole(8, {0, 1, 2}, 8 * i), WholeTarget(8, {3}, 8 * i)});
  }
  auto plan = MakePlan(input, *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  CHECK(ParamsSentBy(*plan) == Counts{{0, 2}, {1, 2}, {2, 2}});

  auto first = MakePlan(input, *FirstHolder());
  REQUIRE(first.ok());
  CHECK(ParamsSentBy(*first) == Counts{{0, 6}});
}

TEST_CASE("tensors laid out alike are planned as each would be alone (covers are shared, not their holders)") {
  // a, b and d have the same source boxes (ZeRO-3 over ranks 0..2) in other buffers
  // and places; c, between them, splits over ranks 0..1. Targets: TP2 on columns,
  // twice (ranks 3, 4 and ranks 4, 3).
  const Index shape{6, 8};
  const auto tensor = [&](const std::string& name, const std::vector<int32_t>& dp, int64_t at) {
    Layout target = *TpSplit(shape, 1, {4, 4}, {3, 4}, 1, {at, at});
    const Layout second = *TpSplit(shape, 1, {4, 4}, {4, 3}, 1, {at + 24, at + 24});
    target.placements.insert(target.placements.end(), second.placements.begin(), second.placements.end());
    return TensorLayouts{name, shape, DType::kBFloat16, DType::kBFloat16, Zero3(shape, dp, 0, at), target};
  };
  PlanInput all = WithBuffers(5, 4096);
  all.tensors = {tensor("a", {0, 1, 2}, 0), tensor("b", {2, 1, 0}, 48), tensor("c", {0, 1}, 96),
                 tensor("d", {1, 2, 0}, 144)};
  auto plan = MakePlan(all, *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  size_t at = 0;
  for (size_t t = 0; t < all.tensors.size(); ++t) {
    PlanInput alone = WithBuffers(5, 4096);
    alone.tensors = {all.tensors[t]};
    auto own = MakePlan(alone, *LocalFirstLeastLoaded());
    REQUIRE(own.ok());
    for (const Segment& expected : own->segments) {
      REQUIRE(at < plan->segments.size());
      const Segment& s = plan->segments[at++];
      INFO("tensor " << all.tensors[t].name << ", segment " << at - 1);
      CHECK(s.tensor == static_cast<int32_t>(t));
      CHECK((s.src == expected.src && s.dst == expected.dst && s.src_base == expected.src_base &&
             s.dst_base == expected.dst_base && s.axes == expected.axes && s.shape == expected.shape &&
             s.src_strides == expected.src_strides && s.dst_strides == expected.dst_strides));
    }
  }
  CHECK(at == plan->segments.size());
}

TEST_CASE("local copies cost nothing and a single holder's load counts: each sender sends one parameter") {
  PlanInput input = WithBuffers(3, 1024);
  // "shared" is on ranks 0 and 1 and listed first; "only0" is on rank 0 alone. Rank 0
  // also wants "shared" (a local copy). Rank 2 wants both.
  input.tensors.push_back(TensorLayouts{"shared", Index{16}, DType::kBFloat16, DType::kBFloat16, Whole(16, {0, 1}),
                                        WholeTarget(16, {0, 2})});
  input.tensors.push_back(TensorLayouts{"only0", Index{16}, DType::kBFloat16, DType::kBFloat16, Whole(16, {0}, 16),
                                        WholeTarget(16, {2}, 16)});
  auto plan = MakePlan(input, *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  CHECK(ParamsSentBy(*plan) == Counts{{0, 1}, {1, 1}});
  int local = 0;
  for (const Segment& s : plan->segments) local += s.src.rank == s.dst.rank;
  CHECK(local == 1);
}

TEST_CASE("planner refuses an uncovered target box, naming tensor, rank and box") {
  PlanInput input = WithBuffers(4, 1024);
  Layout source = Zero3(Index{4, 4}, {0, 1, 2, 3}, 0, 0);
  source.placements.erase(source.placements.begin() + 2);  // rank 2 lacks its shard
  auto target = TpSplit(Index{4, 4}, 1, {2, 2}, {0, 1}, 1, {0, 0});
  REQUIRE(target.ok());
  input.tensors.push_back(TensorLayouts{"w", Index{4, 4}, DType::kBFloat16, DType::kBFloat16, source, *target});
  const std::string error = PlanError(input);
  CHECK_THAT(error, Contains("tensor 'w'") && Contains("rank 0") && Contains("[2:3, 0:2)"));
}

TEST_CASE("planner refuses target placements that overlap on one buffer") {
  PlanInput input = WithBuffers(2, 1024);
  input.tensors.push_back(
      TensorLayouts{"a", Index{8}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}), WholeTarget(8, {1}, 0)});
  input.tensors.push_back(
      TensorLayouts{"b", Index{8}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}, 8), WholeTarget(8, {1}, 4)});
  CHECK_THAT(PlanError(input),
             Contains("tensor 'a'") && Contains("tensor 'b'") && Contains("overlap") && Contains("rank 1"));
}

TEST_CASE("placements registered out of buffer order are accepted, and an overlap is found whatever the order") {
  // a at elements [16, 24) of buffer 1, then b at [0, 8): out of order, disjoint.
  PlanInput input = WithBuffers(2, 1024);
  input.tensors.push_back(
      TensorLayouts{"a", Index{8}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}), WholeTarget(8, {1}, 16)});
  input.tensors.push_back(
      TensorLayouts{"b", Index{8}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}, 8), WholeTarget(8, {1}, 0)});
  CHECK(MakePlan(input, *LocalFirstLeastLoaded()).ok());
  // c at [12, 20) overlaps a, and comes after b, which started lower.
  input.tensors.push_back(
      TensorLayouts{"c", Index{8}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}, 16), WholeTarget(8, {1}, 12)});
  CHECK_THAT(PlanError(input),
             Contains("tensor 'c'") && Contains("tensor 'a'") && Contains("overlap") && Contains("at byte 32"));
}

TEST_CASE("planner refuses a box outside the tensor, naming tensor and rank") {
  PlanInput input = WithBuffers(2, 1024);
  Layout target = WholeTarget(8, {1});
  target.placements[0].box.hi[0] = 9;
  input.tensors.push_back(TensorLayouts{"w", Index{8}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}), target});
  CHECK_THAT(PlanError(input),
             Contains("tensor 'w'") && Contains("[0:9)") && Contains("rank 1") && Contains("outside the tensor"));
}

TEST_CASE("planner refuses a placement that does not fit its buffer") {
  PlanInput input = WithBuffers(2, 16);  // 8 bf16 elements
  input.tensors.push_back(
      TensorLayouts{"w", Index{8}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}, 1), WholeTarget(8, {1})});
  CHECK_THAT(PlanError(input),
             Contains("tensor 'w'") && Contains("rank 0") && Contains("needs 18 bytes") && Contains("has 16"));
}

TEST_CASE("planner refuses overflowing strides, negative values and unregistered buffers") {
  PlanInput input = WithBuffers(2, 1024);
  Layout source = Whole(8, {0});
  source.placements[0].strides[0] = int64_t{1} << 62;
  input.tensors.push_back(
      TensorLayouts{"w", Index{8}, DType::kBFloat16, DType::kBFloat16, source, WholeTarget(8, {1})});
  CHECK_THAT(PlanError(input),
             Contains("tensor 'w'") && Contains("stride 4611686018427387904") && Contains("at most 2147483647"));

  // Each stride and extent within 32 bits, the last element's offset past 2^63.
  const int64_t big = kMaxSegmentAxis;
  PlanInput wide = WithBuffers(2, 1024);
  Layout huge = WholeTarget(1, {0});
  huge.placements[0].box = Box{{0, 0}, {big, big}};
  huge.placements[0].strides = Index{big, big};
  wide.tensors.push_back(TensorLayouts{"h", Index{big, big}, DType::kBFloat16, DType::kBFloat16, huge, huge});
  CHECK_THAT(PlanError(wide), Contains("tensor 'h'") && Contains("buffer has 1024"));

  PlanInput long_axis = WithBuffers(2, 1024);
  long_axis.tensors.push_back(
      TensorLayouts{"l", Index{big + 1}, DType::kBFloat16, DType::kBFloat16, Whole(8, {0}), WholeTarget(8, {1})});
  CHECK_THAT(PlanError(long_axis), Contains("tensor 'l'") && Contains("an axis of 2147483648 elements"));

  input.tensors[0].source = Whole(8, {0});
  input.tensors[0].source.placements[0].base = -1;
  CHECK_THAT(PlanError(input), Contains("negative base"));

  input.tensors[0].source = Whole(8, {5});
  CHECK_THAT(PlanError(input), Contains("rank 5") && Contains("unregistered buffer"));

  input.tensors[0].source = Whole(8, {0});
  input.buffers.push_back(Buffer{Holder{0, 0}, 8, ""});
  CHECK_THAT(PlanError(input), Contains("registered twice"));
}

TEST_CASE("tensors match by name; shape and dtype mismatches and unknown names are refused") {
  const TensorSide source{"w", Index{4, 4}, DType::kFloat32, Layout{}};
  TensorSide target{"w", Index{4, 4}, DType::kBFloat16, Layout{}};
  auto matched = MatchTensors({source}, {target});
  REQUIRE(matched.ok());
  CHECK(matched->at(0).source_dtype == DType::kFloat32);  // float32 -> bfloat16 is converted

  target.shape = Index{4, 5};
  auto shape = MatchTensors({source}, {target});
  CHECK_THAT(std::string(shape.status().message()), Contains("tensor 'w'") && Contains("shape mismatch"));

  target.name = "missing";
  auto unknown = MatchTensors({source}, {target});
  CHECK(absl::IsNotFound(unknown.status()));
  CHECK_THAT(std::string(unknown.status().message()), Contains("'missing'"));

  PlanInput input = WithBuffers(2, 1024);
  input.tensors.push_back(
      TensorLayouts{"w", Index{8}, DType::kFloat16, DType::kBFloat16, Whole(8, {0}), WholeTarget(8, {1})});
  CHECK_THAT(PlanError(input), Contains("tensor 'w'") && Contains("dtype mismatch") && Contains("float16"));
}

TEST_CASE("empty batches, zero-sized tensors and scalars plan correctly") {
  PlanInput input = WithBuffers(2, 64);
  auto empty = MakePlan(input, *LocalFirstLeastLoaded());
  REQUIRE(empty.ok());
  CHECK(empty->segments.empty());

  input.tensors.push_back(TensorLayouts{"zero", Index{0, 4}, DType::kBFloat16, DType::kBFloat16,
                                        Zero3(Index{0, 4}, {0, 1}, 0, 0),
                                        *TpSplit(Index{0, 4}, 1, {2, 2}, {0, 1}, 1, {0, 0})});
  input.tensors.push_back(TensorLayouts{"scalar", Index{}, DType::kBFloat16, DType::kBFloat16,
                                        Replicated(Index{}, {0}, 0, {0}), Replicated(Index{}, {1}, 1, {0})});
  auto plan = MakePlan(input, *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  REQUIRE(plan->segments.size() == 1);
  CHECK(plan->segments[0].tensor == 1);
  CHECK(SegmentElements(plan->segments[0]) == 1);
}

TEST_CASE("contiguous pieces coalesce and contiguous axes merge into one run") {
  // ZeRO-3 over 3 ranks of a [6, 5] tensor into TP1 on rank 0: each partition is one
  // contiguous run on both sides, however many boxes it was cut into.
  PlanInput input = WithBuffers(3, 1024);
  input.tensors.push_back(TensorLayouts{"w", Index{6, 5}, DType::kBFloat16, DType::kBFloat16,
                                        Zero3(Index{6, 5}, {0, 1, 2}, 0, 0), Replicated(Index{6, 5}, {0}, 1, {0})});
  auto plan = MakePlan(input, *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  REQUIRE(plan->segments.size() == 3);
  for (const Segment& s : plan->segments) {
    CHECK(s.axes == 1);
    CHECK(s.shape[0] == 10);
    CHECK(s.src_strides[0] == 1);
  }
}

}  // namespace
}  // namespace shardsync::planner

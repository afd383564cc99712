// Pins the layout facts the builders match (DeepSpeed, vLLM, SGLang; planner/builders.h).
#include "planner/builders.h"

#include <catch2/catch.hpp>

#include "planner/box.h"
#include "planner/model_layout.h"
#include "planner/plan.h"

namespace shardsync::planner {
namespace {

TEST_CASE("ZeRO-3 partitions: n=10 over 8 ranks leaves ranks 5..7 holding nothing") {
  const Layout layout = Zero3(Index{10}, {0, 1, 2, 3, 4, 5, 6, 7}, 0, 100);
  REQUIRE(layout.placements.size() == 5);
  for (int r = 0; r < 5; ++r) {
    CHECK(layout.placements[r].holder.rank == r);
    CHECK(layout.placements[r].box == Box{{2 * r}, {2 * r + 2}});
    CHECK(layout.placements[r].base == 100);
  }
}

TEST_CASE("ZeRO-3 partitions of a 2-D tensor become row pieces at their flat offsets") {
  // n = 12, w = 5, p = 3: rank 1 holds flat [3, 6) = row 0 col 3, row 1 cols 0..1.
  const Layout layout = Zero3(Index{3, 4}, {10, 11, 12, 13, 14}, 7, 50);
  std::vector<Placement> rank1;
  for (const Placement& p : layout.placements) {
    if (p.holder.rank == 11) rank1.push_back(p);
    CHECK(p.holder.rank != 14);  // 12 elements fill only four partitions
  }
  REQUIRE(rank1.size() == 2);
  CHECK(rank1[0].box == Box{{0, 3}, {1, 4}});
  CHECK(rank1[0].base == 50);
  CHECK(rank1[1].box == Box{{1, 0}, {2, 2}});
  CHECK(rank1[1].base == 51);
  CHECK(rank1[1].strides == Index{4, 1});
}

TEST_CASE("ZeRO-3 partitions sit back to back; a ZeRO-1/2 flat is padded to a multiple of 2w") {
  CHECK(Zero3Offsets({10, 7, 1}, 4) == std::vector<int64_t>{0, 3, 5, 6});
  CHECK(Zero12Offsets({10, 7, 1}, 4) == std::vector<int64_t>{0, 10, 17, 24});
  const Layout flat = Zero12(Index{2, 3}, {0, 1}, 0, 10);
  REQUIRE(flat.placements.size() == 2);
  CHECK(flat.placements[1].box == FullBox(Index{2, 3}));
  CHECK(flat.placements[1].base == 10);
}

TEST_CASE("AutoTP splits unevenly: the first total % tp ranks get one more unit") {
  CHECK(UnevenSplit(10, 4) == std::vector<int64_t>{3, 3, 2, 2});
  auto layout = TpSplit(Index{4, 10}, 1, {3, 3, 2, 2}, {0, 1, 2, 3}, 0, {0, 0, 0, 0});
  REQUIRE(layout.ok());
  CHECK(layout->placements[2].box == Box{{0, 6}, {4, 8}});
  CHECK(layout->placements[2].strides == Index{2, 1});  // row-parallel shard [4, 2]
  CHECK_FALSE(TpSplit(Index{4, 10}, 1, {3, 3, 2}, {0, 1, 2}, 0, {0, 0, 0}).ok());
}

TEST_CASE("fused qkv with tp > kv heads replicates each kv head on tp/kv ranks") {
  // NH = 8, NKV = 2, hd = 2, tp = 4: nh = 2, nkv = 1, rep = 2.
  auto views = FusedQkv(8, 2, 2, Index{3}, {0, 1, 2, 3}, 0, {0, 100, 200, 300});
  REQUIRE(views.ok());
  CHECK(FusedQkvShardRows(8, 2, 2, 4) == 8);
  const Placement& q = views->q.placements[3];
  const Placement& k = views->k.placements[3];
  const Placement& v = views->v.placements[3];
  CHECK(q.box == Box{{12, 0}, {16, 3}});
  CHECK(q.base == 300);
  CHECK(k.box == Box{{2, 0}, {4, 3}});  // s = 3 / 2 = 1
  CHECK(k.base == 300 + 4 * 3);
  CHECK(v.box == Box{{2, 0}, {4, 3}});
  CHECK(v.base == 300 + 6 * 3);
  CHECK(views->k.placements[2].box == k.box);  // ranks 2 and 3 share kv head 1
}

TEST_CASE("fused qkv with tp < kv heads gives each rank its own kv heads") {
  auto views = FusedQkv(8, 4, 2, Index{}, {5, 6}, 0, {0, 0});
  REQUIRE(views.ok());
  CHECK(views->q.placements[1].box == Box{{8}, {16}});
  CHECK(views->k.placements[1].box == Box{{4}, {8}});
  CHECK(views->v.placements[1].base == 8 + 4);
  CHECK_FALSE(FusedQkv(6, 4, 2, Index{}, {5, 6, 7, 8}, 0, {0, 0, 0, 0}).ok());
}

TEST_CASE("fused gate_up places sub-weight k at local rows after the earlier ones") {
  auto layouts = FusedRows({8, 8}, Index{2}, {0, 1}, 0, {0, 40});
  REQUIRE(layouts.ok());
  const Placement& up1 = (*layouts)[1].placements[1];
  CHECK(up1.box == Box{{4, 0}, {8, 2}});
  CHECK(up1.base == 40 + 4 * 2);
  CHECK((*layouts)[0].placements[1].base == 40);
}

TEST_CASE("a padded vocabulary zero-fills the rows past the real vocabulary") {
  // V = 100 -> Vp = 128, tp = 4: 32 rows each; rank 3 holds rows 96..99 and 28 pad rows.
  auto layout = PaddedVocab(100, Index{5}, {0, 1, 2, 3}, 0, {0, 0, 0, 1000});
  REQUIRE(layout.ok());
  CHECK(layout->placements.size() == 4);
  CHECK(layout->placements[3].box == Box{{96, 0}, {100, 5}});
  REQUIRE(layout->fills.size() == 1);
  CHECK(layout->fills[0].base == 1000 + 4 * 5);
  CHECK(layout->fills[0].shape == Index{28, 5});
  CHECK_FALSE(PaddedVocab(100, Index{5}, {0, 1, 2}, 0, {0, 0, 0}).ok());  // 128 rows over 3
}

TEST_CASE("nest composes a TP layout whose shards are themselves ZeRO-3 partitioned") {
  auto outer = TpSplit(Index{4, 6}, 0, {2, 2}, {0, 1}, 0, {0, 0});
  REQUIRE(outer.ok());
  const std::vector<Layout> inner = {Zero3(Index{2, 6}, {7, 8}, 3, 0), Zero3(Index{2, 6}, {9, 10}, 3, 0)};
  auto nested = Nest(*outer, inner);
  REQUIRE(nested.ok());
  REQUIRE(nested->placements.size() == 2 * 1 + 2 * 1);
  CHECK(nested->placements[2].holder.rank == 9);
  CHECK(nested->placements[2].box == Box{{2, 0}, {3, 6}});
  CHECK(nested->placements[3].box == Box{{3, 0}, {4, 6}});
  CHECK_FALSE(Nest(*outer, {inner[0]}).ok());  // names inner layout 1 of 1
}

TEST_CASE("tied embeddings: the head's target placements read the embedding's source") {
  ModelLayoutSpec spec;
  spec.dp_ranks = {0, 1};
  spec.replicas = {{0, 1}};
  ModelTensor embed;
  embed.name = "embed";
  embed.shape = {100, 4};
  embed.style = TpStyle::kVocab;
  ModelTensor head = embed;
  head.name = "lm_head";
  head.tied_to = "embed";
  spec.tensors = {embed, head};
  auto input = ExpandModel(spec);
  REQUIRE(input.ok());
  REQUIRE(input->tensors.size() == 1);
  CHECK(input->tensors[0].target.placements.size() == 4);  // two ranks, embedding and head
  CHECK(input->tensors[0].target.fills.size() == 2);
}

TEST_CASE("a model with zero-sized tensors expands and plans to nothing to move") {
  ModelLayoutSpec spec;
  spec.dp_ranks = {0, 1, 2};
  spec.replicas = {{0, 1, 2}};
  spec.tensors = {MakeTensor("rows", Index{0, 8}, DType::kBFloat16, TpStyle::kColumn),
                  MakeTensor("cols", Index{8, 0}, DType::kBFloat16, TpStyle::kRow)};
  auto input = ExpandModel(spec);
  REQUIRE(input.ok());
  auto plan = MakePlan(*input, *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  CHECK(plan->segments.empty());
}

}  // namespace
}  // namespace shardsync::planner

// What the coordinator hands the planner from the agents' publications: every target,
// or for a partial sync only the targets of the ranks named.
#include "daemon/coordinator/layouts.h"

#include <catch2/catch.hpp>
#include <set>

#include "planner/plan.h"

namespace shardsync::coordinator {
namespace {

// ZeRO-3 over ranks 0-3 into one TP2 replica on ranks 2 and 3, published as each
// rank's trainer and rollout would publish it.
std::map<int32_t, v1::PublishRequest> Published() {
  auto spec = spec::ParseLayoutSpecJson(R"({"model": {"tensors": [
      {"name": "up", "shape": [40, 16], "style": "COLUMN"},
      {"name": "down", "shape": [16, 40], "style": "ROW"},
      {"name": "norm", "shape": [16]}],
    "zero_stage": 3, "dp_ranks": [0, 1, 2, 3], "replicas": [{"ranks": [2, 3]}]}})");
  REQUIRE(spec.ok());
  spec::BufferIds ids;
  auto input = spec::ToPlanInput(*spec, ids);
  REQUIRE(input.ok());
  std::map<int32_t, v1::PublishRequest> published;
  for (int32_t rank = 0; rank < 4; ++rank) {
    published[rank].set_rank(rank);
    for (bool sources : {true, false}) {
      const spec::RankSide side = spec::RankLayouts(*input, ids, rank, sources);
      if (side.buffers.empty()) continue;
      v1::PublishedLayout& layout = *published[rank].add_layouts();
      layout.set_role(sources ? v1::SOURCE : v1::TARGET);
      for (const v1::BufferInfo& b : side.buffers) *layout.add_buffers() = b;
      for (const v1::TensorLayout& t : side.tensors) *layout.add_tensors() = t;
    }
  }
  return published;
}

// The ranks that hold target placements in `input`, and how many sources there are.
std::pair<std::set<int32_t>, size_t> Sides(const planner::PlanInput& input) {
  std::set<int32_t> target_ranks;
  size_t sources = 0;
  for (const planner::TensorLayouts& t : input.tensors) {
    for (const planner::Placement& p : t.target.placements) target_ranks.insert(p.holder.rank);
    sources += t.source.placements.size();
  }
  return {target_ranks, sources};
}

TEST_CASE("the ranks that publish targets are named, ascending") {
  CHECK(TargetRanks(Published()) == std::vector<int32_t>{2, 3});
  CHECK(TargetRanks({}).empty());
}

TEST_CASE("a partial selection keeps every source but only the targets of the ranks named") {
  const auto published = Published();
  spec::BufferIds all_ids, partial_ids;
  auto all = CollectPlanInput(published, all_ids);
  auto partial = CollectPlanInput(published, partial_ids, {3});
  REQUIRE(all.ok());
  REQUIRE(partial.ok());
  CHECK(Sides(*all).first == std::set<int32_t>{2, 3});
  CHECK(Sides(*partial).first == std::set<int32_t>{3});
  CHECK(Sides(*partial).second == Sides(*all).second);  // every source may be read
  CHECK(partial->tensors.size() == 3);
  CHECK(partial->buffers.size() == all->buffers.size());

  // The partial plan writes every element of rank 3's targets and nothing on rank 2.
  auto plan = planner::MakePlan(*partial, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  int64_t written_on_3 = 0;
  for (const planner::Segment& s : plan->segments) {
    CHECK(s.dst.rank == 3);
    written_on_3 += planner::SegmentElements(s);
  }
  CHECK(written_on_3 == (40 * 16 + 16 * 40) / 2 + 16);  // half of each split weight, the whole norm
}

TEST_CASE("a tensor's sources come from one uid unless the operator shares it among several") {
  std::map<int32_t, v1::PublishRequest> published = Published();
  for (auto& [rank, publication] : published) {
    for (v1::PublishedLayout& layout : *publication.mutable_layouts()) layout.set_uid(1000);
  }
  CHECK(CheckSourceOwners(published, {}).ok());
  published[3].mutable_layouts(0)->set_uid(1001);  // rank 3's trainer runs as another user
  published[3].mutable_layouts(0)->set_client_id("intruder");
  const absl::Status refused = CheckSourceOwners(published, {});
  CHECK(refused.code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(refused.message()),
             Catch::Matchers::Contains("from uid 1000") &&
                 Catch::Matchers::Contains("from uid 1001 (client 'intruder' on rank 3)"));
  CHECK(CheckSourceOwners(published, {1000, 1001}).ok());
  CHECK_FALSE(CheckSourceOwners(published, {1001}).ok());  // both must be named
}

}  // namespace
}  // namespace shardsync::coordinator

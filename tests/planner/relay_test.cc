// Ranks on several nodes: a piece is read from a holder on the target's node when one
// has it, and with the relay each element crosses the network once per node, into one
// replica, whose target the node's other replicas copy in stage 1.
#include "planner/relay.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "planner/builders.h"
#include "planner/cost.h"
#include "planner/model_layout.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "tests/planner/random_layouts.h"
#include "tests/planner/reference_executor.h"
#include "tests/planner/sync_check.h"

namespace shardsync::planner {
namespace {

// Trainer ZeRO-3 over ranks 0-1 (node 0), one TP=`tp` replica per `tp` ranks of 2-5
// (node 1): a disaggregated trainer and rollout.
PlanInput TrainerNodeRolloutNode(int tp) {
  ModelLayoutSpec spec;
  spec.zero_stage = 3;
  spec.dp_ranks = {0, 1};
  for (int first = 2; first < 6; first += tp) {
    std::vector<int32_t> ranks;
    for (int t = 0; t < tp; ++t) ranks.push_back(first + t);
    spec.replicas.push_back(ranks);
  }
  spec.tensors = {MakeTensor("w", Index{16, 8}, DType::kBFloat16, TpStyle::kColumn),
                  MakeTensor("o", Index{8, 16}, DType::kBFloat16, TpStyle::kRow), MakeTensor("norm", Index{8})};
  PlanInput input = *ExpandModel(spec);
  input.node_of_rank = {0, 0, 1, 1, 1, 1};
  return input;
}

Plan PlanOf(const PlanInput& input, bool relay) {
  auto plan = MakePlan(input, *LocalFirstLeastLoaded(), PlanOptions{relay});
  REQUIRE(plan.ok());
  return *plan;
}

// Syncs `plan` with the reference executor (each stage reads only what the stages
// before it wrote) and checks every element.
void CheckExact(const PlanInput& input, const Plan& plan, int64_t budget, std::mt19937_64& rng) {
  auto schedules = MakeSchedules(plan, budget);
  REQUIRE(schedules.ok());
  testing::HostBuffers buffers = testing::AllocateBuffers(input);
  const testing::TensorValues values = testing::PrepareBuffers(input, rng, buffers);
  const testing::HostBuffers before = buffers;
  auto executed = testing::Execute(plan, *schedules, budget, buffers);
  REQUIRE(executed.ok());
  const std::vector<std::string> errors = testing::CheckSync(input, values, before, buffers);
  INFO((errors.empty() ? std::string() : errors.front()));
  CHECK(errors.empty());
}

TEST_CASE("a piece that a holder on the target's node has is read there, not across the network") {
  // ZeRO-1: the flat is whole on ranks 0 (node 0) and 2 (node 1); the target on rank 3.
  ModelLayoutSpec spec;
  spec.zero_stage = 1;
  spec.dp_ranks = {0, 2};
  spec.replicas = {{3}};
  for (int i = 0; i < 6; ++i) spec.tensors.push_back(MakeTensor("p" + std::to_string(i), Index{64}));
  PlanInput input = *ExpandModel(spec);
  const Plan one_node = PlanOf(input, false);
  std::map<int32_t, int> senders;
  for (const Segment& s : one_node.segments) ++senders[s.src.rank];
  CHECK(senders.size() == 2);  // one node: the load is spread over both holders

  input.node_of_rank = {0, 0, 1, 1};
  const Plan nodes = PlanOf(input, false);
  for (const Segment& s : nodes.segments) CHECK(s.src.rank == 2);
  CHECK(ComputeStats(nodes, {}).total_network_bytes == 0);
}

TEST_CASE("with the relay each element crosses the network once per node, the relays sharing the load") {
  std::mt19937_64 rng(11);
  for (int tp : {1, 2}) {
    INFO("TP=" << tp << " replicas on node 1");
    const PlanInput input = TrainerNodeRolloutNode(tp);
    const Plan direct = PlanOf(input, false);
    const Plan relayed = PlanOf(input, true);
    const PlanStats d = ComputeStats(direct, {});
    const PlanStats r = ComputeStats(relayed, {});
    const int64_t model_bytes = (16 * 8 + 8 * 16 + 8) * 2;
    // Node 1 holds w and o once per replica, the norm whole on each of its 4 ranks.
    const int64_t node_bytes = 4 / tp * (16 * 8 + 8 * 16) * 2 + 4 * 8 * 2;
    CHECK(direct.stages == 1);
    CHECK(relayed.stages == 2);
    CHECK(d.total_network_bytes == node_bytes);
    CHECK(r.total_network_bytes == model_bytes);
    CHECK(r.total_relayed_bytes == node_bytes - model_bytes);
    for (const Segment& s : relayed.segments) {
      if (s.stage == 0) continue;
      CHECK(s.src.rank >= 2);  // a relay reads a target of node 1
      CHECK(s.src.buffer == 1);
      CHECK(s.dst.rank >= 2);
    }
    // Every rank of node 1 takes a share of the network: none receives it all.
    for (int rank = 2; rank < 6; ++rank) {
      CHECK(r.ranks[rank].network_received_bytes > 0);
      CHECK(r.ranks[rank].network_received_bytes < model_bytes);
    }
    CheckExact(input, direct, 1 << 20, rng);
    CheckExact(input, relayed, 1 << 20, rng);
    CheckExact(input, relayed, 16, rng);  // chunks of two elements: many rounds in both stages
  }
}

TEST_CASE("a relay stage's rounds are numbered after the first stage's on every rank") {
  const Plan plan = PlanOf(TrainerNodeRolloutNode(1), true);
  auto schedules = MakeSchedules(plan, 64);
  REQUIRE(schedules.ok());
  int32_t most = 0;
  for (const Schedule& s : *schedules) {
    REQUIRE(s.stages.size() == 2);
    CHECK(s.stages[0].first_round == 0);
    most = std::max(most, s.stages[0].rounds);
    CHECK(CheckChunks(plan, s, 64).ok());
  }
  CHECK(most > 1);
  for (const Schedule& s : *schedules) CHECK(s.stages[1].first_round == most);
  // Rank 2 relays to rank 3 in stage 1: a stage-1 segment listed in stage 0 is refused.
  Schedule wrong = (*schedules)[2];
  REQUIRE_FALSE(wrong.stages[1].sends.empty());
  std::swap(wrong.stages[0].sends, wrong.stages[1].sends);
  CHECK_FALSE(CheckChunks(plan, wrong, 64).ok());
}

TEST_CASE("the cheaper plan relays unless the node's link is slow against the network") {
  // Direct, the trainer's two ranks send the model to each of 4 replicas: 2 models
  // each. Relayed, half a model each, then node 1 forwards 3/4 of one over its link.
  const PlanInput input = TrainerNodeRolloutNode(1);
  std::pair<double, double> floors;
  for (double network : {50.0, 400.0}) {
    auto relayed =
        MakePlanWithRelay(input, *LocalFirstLeastLoaded(), RelayMode::kAuto, Bandwidths{400, 4000, network}, &floors);
    REQUIRE(relayed.ok());
    CHECK(relayed->stages == 2);
    CHECK(floors.second < floors.first);
  }
  auto direct =
      MakePlanWithRelay(input, *LocalFirstLeastLoaded(), RelayMode::kAuto, Bandwidths{400, 4000, 4000}, &floors);
  REQUIRE(direct.ok());
  CHECK(direct->stages == 1);
  CHECK(floors.first <= floors.second);
  const auto slow_network =
      MakePlanWithRelay(input, *LocalFirstLeastLoaded(), RelayMode::kAuto, Bandwidths{400, 4000, 50});
  // The floor adds the stages: the relay's second stage is not free.
  const PlanStats stats = ComputeStats(*slow_network, {});
  const double network_only = CostFloorSeconds(stats, Bandwidths{1e30, 1e30, 50});
  CHECK(CostFloorSeconds(stats, Bandwidths{400, 4000, 50}) > network_only);
  const std::vector<double> by_stage = StageFloorSeconds(stats.stages, Bandwidths{400, 4000, 50});
  REQUIRE(by_stage.size() == 2);
  CHECK(by_stage[0] + by_stage[1] == Approx(CostFloorSeconds(stats, Bandwidths{400, 4000, 50})));
  CHECK(by_stage[0] == Approx(network_only));  // stage 1 is network-bound, stage 2 link-bound
  // The modes by name, as the flags give them.
  CHECK(*ParseRelayMode("never") == RelayMode::kNever);
  CHECK(*ParseRelayMode("always") == RelayMode::kAlways);
  CHECK(*ParseRelayMode("auto") == RelayMode::kAuto);
  CHECK_THAT(std::string(ParseRelayMode("sometimes").status().message()), Catch::Matchers::Contains("'sometimes'"));
}

TEST_CASE("one node, or the relay off, plans as before: one stage and no relayed byte") {
  PlanInput input = TrainerNodeRolloutNode(2);
  input.node_of_rank.assign(6, 0);
  const Plan plan = PlanOf(input, true);
  CHECK(plan.stages == 1);
  input.node_of_rank.clear();
  CHECK(PlanOf(input, true).segments.size() == plan.segments.size());
}

TEST_CASE("a rank without a node is refused") {
  PlanInput input = TrainerNodeRolloutNode(2);
  input.node_of_rank.resize(4);
  auto plan = MakePlan(input, *LocalFirstLeastLoaded(), PlanOptions{true});
  REQUIRE_FALSE(plan.ok());
  CHECK_THAT(std::string(plan.status().message()), Catch::Matchers::Contains("on rank 4 has no node"));
}

TEST_CASE("random models over random nodes sync bit for bit relayed, never with more bytes on the network") {
  const auto policy = LocalFirstLeastLoaded();
  int relayed_cases = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 rng(seed * 104729);
    auto input = ExpandModel(testing::RandomModel(rng));
    REQUIRE(input.ok());
    const int nodes = 1 + static_cast<int>(rng() % 3);
    testing::PlaceOnRandomNodes(*input, nodes, rng);
    INFO("seed " << seed << ", " << input->node_of_rank.size() << " ranks on up to " << nodes << " nodes");
    const Plan direct = PlanOf(*input, false);
    const Plan relayed = PlanOf(*input, true);
    CHECK(ComputeStats(relayed, {}).total_network_bytes <= ComputeStats(direct, {}).total_network_bytes);
    relayed_cases += relayed.stages == 2;
    const int64_t budgets[] = {64, 1000, int64_t{1} << 40};
    CheckExact(*input, relayed, budgets[rng() % 3], rng);
  }
  CHECK(relayed_cases > 30);  // the relay is really exercised
}

}  // namespace
}  // namespace shardsync::planner

// Schedules: chunk cuts within the staging budget, both ends of a link agreeing, the
// digest and the cost floor.
#include "planner/schedule.h"

#include <catch2/catch.hpp>
#include <functional>
#include <random>

#include "planner/builders.h"
#include "planner/cost.h"
#include "planner/digest.h"
#include "planner/model_layout.h"
#include "tests/planner/random_layouts.h"

namespace shardsync::planner {
namespace {

using Catch::Matchers::Contains;

// Rank 0 holds a [rows, cols] bf16 tensor; rank 1 wants it whole.
PlanInput OneTransfer(int64_t rows, int64_t cols, DType target = DType::kBFloat16) {
  PlanInput input;
  input.buffers = {Buffer{Holder{0, 0}, 4 * rows * cols, ""}, Buffer{Holder{1, 0}, 4 * rows * cols, ""}};
  input.tensors.push_back(TensorLayouts{"w", Index{rows, cols}, DType::kFloat32, target,
                                        Replicated(Index{rows, cols}, {0}, 0, {0}),
                                        Replicated(Index{rows, cols}, {1}, 0, {0})});
  return input;
}

std::vector<Schedule> Schedules(const PlanInput& input, int64_t budget, Plan* plan_out = nullptr) {
  auto plan = MakePlan(input, *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  auto schedules = MakeSchedules(*plan, budget);
  REQUIRE(schedules.ok());
  if (plan_out) *plan_out = *plan;
  return *schedules;
}

TEST_CASE("a stream is cut into chunks of a quarter of the budget, splitting rows when one is larger") {
  // 3 rows of 5 float32 -> bfloat16: 30 bytes on the link; budget 32 bytes = four slots
  // (send and receive, two each) of 4 elements.
  const std::vector<Schedule> schedules = Schedules(OneTransfer(3, 5), 32);
  const PeerStream& send = schedules[0].stages.at(0).sends.at(0);
  CHECK(send.peer == 1);
  CHECK(send.bytes == 30);
  REQUIRE(send.chunks.size() == 4);
  CHECK(send.chunks[0].bytes == 8);
  CHECK(send.chunks[3].bytes == 6);
  CHECK(send.chunks[1].first_begin == 4);
  CHECK(send.chunks[1].last_end == 8);
  CHECK(schedules[0].rounds() == 4);
  CHECK(schedules[1].rounds() == 4);
}

TEST_CASE("a budget smaller than one element is refused, naming the tensor") {
  auto plan = MakePlan(OneTransfer(2, 2, DType::kFloat32), *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  auto schedules = MakeSchedules(*plan, 3);
  REQUIRE_FALSE(schedules.ok());
  CHECK_THAT(std::string(schedules.status().message()), Contains("tensor 'w'") && Contains("3 bytes"));
  CHECK_FALSE(MakeSchedules(*plan, 0).ok());
  CHECK_FALSE(MakeSchedules(*plan, 15).ok());  // four slots of 3 bytes: no float32 fits
  CHECK(MakeSchedules(*plan, 16).ok());
}

TEST_CASE("a budget that would cut a plan into too many chunks is refused before cutting, naming the budget") {
  // 2^17 x 2^17 float32 -> bfloat16: 32 GiB on the link, 32 M chunks of 1 KiB.
  auto plan = MakePlan(OneTransfer(int64_t{1} << 17, int64_t{1} << 17), *LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  const absl::StatusOr<std::vector<Schedule>> refused = MakeSchedules(*plan, kMinStagingBytes);
  REQUIRE(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()),
             Contains("staging budget of 4096 bytes") && Contains("16777216 chunks"));
  CHECK(MakeSchedules(*plan, int64_t{1} << 30).ok());  // 128 chunks of 256 MiB
}

TEST_CASE("an executor refuses chunks that do not add up or do not fit a slot") {
  Plan plan;
  const std::vector<Schedule> schedules = Schedules(OneTransfer(3, 5), 32, &plan);
  CHECK(CheckChunks(plan, schedules[0], 32).ok());
  CHECK(CheckChunks(plan, schedules[1], 32).ok());
  CHECK_FALSE(CheckChunks(plan, schedules[1], 28).ok());  // a slot of 7 bytes: chunks of 8 do not fit

  Schedule lying = schedules[1];
  lying.stages[0].receives[0].chunks[0].bytes += 2;
  CHECK_THAT(std::string(CheckChunks(plan, lying, 1 << 20).message()), Contains("says 10 bytes, holds 8"));
  Schedule empty = schedules[1];
  empty.stages[0].receives[0].chunks[0].last_end = empty.stages[0].receives[0].chunks[0].first_begin;
  CHECK_FALSE(CheckChunks(plan, empty, 1 << 20).ok());
  Schedule short_rounds = schedules[1];
  short_rounds.stages[0].rounds = 2;
  CHECK_THAT(std::string(CheckChunks(plan, short_rounds, 1 << 20).message()), Contains("more chunks than 2 rounds"));
}

TEST_CASE("chunk k that a rank sends to a peer is chunk k the peer receives from it") {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    auto input = ExpandModel(testing::RandomModel(rng));
    REQUIRE(input.ok());
    const std::vector<Schedule> schedules = Schedules(*input, 16 + seed);
    for (const Schedule& s : schedules) {
      for (const PeerStream& send : s.stages[0].sends) {
        const auto& peer = schedules[send.peer].stages[0].receives;
        auto it = std::find_if(peer.begin(), peer.end(), [&](const PeerStream& r) { return r.peer == s.rank; });
        REQUIRE(it != peer.end());
        CHECK(it->segments == send.segments);
        REQUIRE(it->chunks.size() == send.chunks.size());
        for (size_t k = 0; k < send.chunks.size(); ++k) {
          CHECK(it->chunks[k].bytes == send.chunks[k].bytes);
          CHECK(it->chunks[k].bytes <= MaxChunkBytes(16 + static_cast<int64_t>(seed)));
        }
      }
    }
  }
}

TEST_CASE("the digest is the same for the same plan and differs for another plan or budget") {
  std::mt19937_64 rng(3);
  const ModelLayoutSpec spec = testing::RandomModel(rng);
  Plan a, b;
  Schedules(*ExpandModel(spec), 64, &a);
  Schedules(*ExpandModel(spec), 64, &b);
  CHECK(PlanDigest(a, 64) == PlanDigest(b, 64));
  CHECK(PlanDigest(a, 64).size() == 32);
  CHECK(PlanDigest(a, 64) != PlanDigest(a, 128));
  Plan c;
  Schedules(OneTransfer(3, 5), 64, &c);
  CHECK(PlanDigest(c, 64) != PlanDigest(a, 64));
  // Pinned: the digest of this plan must not change between runs or builds (it changes
  // only with its definition: fields packed two to a word, the counts after the
  // segments so that a streamed plan can be digested as it comes).
  CHECK(PlanDigest(c, 64) == "01c22440f4c214f78afce5d41894e42d");
}

TEST_CASE("the digest changes with every field of a segment") {
  Plan plan;
  Schedules(OneTransfer(3, 5), 64, &plan);
  REQUIRE(plan.segments.size() == 1);
  plan.segments.push_back(plan.segments[0]);  // a second segment, for the odd lane
  plan.segments[1].dst_base += 1000;
  for (Segment& s : plan.segments) s.axes = 2;  // axis 1 is hashed too
  const std::string original = PlanDigest(plan, 64);
  const std::vector<std::function<void(Segment&)>> changes = {
      [](Segment& s) { s.tensor += 1; },
      [](Segment& s) { s.stage = 1; },
      [](Segment& s) { s.src.rank += 1; },
      [](Segment& s) { s.src.buffer += 1; },
      [](Segment& s) { s.dst.rank += 1; },
      [](Segment& s) { s.dst.buffer += 1; },
      [](Segment& s) { s.src_base += 1; },
      [](Segment& s) { s.dst_base += int64_t{1} << 40; },
      [](Segment& s) { s.src_dtype = s.src_dtype == DType::kInt8 ? DType::kUInt8 : DType::kInt8; },
      [](Segment& s) { s.dst_dtype = s.dst_dtype == DType::kInt8 ? DType::kUInt8 : DType::kInt8; },
      [](Segment& s) { s.axes = s.axes == 1 ? 2 : 1; },
      [](Segment& s) { s.shape[0] += 1; },
      [](Segment& s) { s.shape[1] += 1; },
      [](Segment& s) { s.src_strides[1] += 1; },
      [](Segment& s) { s.dst_strides[0] += 1; },
      [](Segment& s) { s.dst_strides[1] += 1; },
  };
  for (size_t c = 0; c < changes.size(); ++c) {
    for (size_t i : {size_t{0}, size_t{1}}) {  // an even and an odd segment (two lanes)
      Plan changed = plan;
      changes[c](changed.segments[i]);
      INFO("change " << c << " of segment " << i);
      CHECK(PlanDigest(changed, 64) != original);
    }
  }
  Plan swapped = plan;
  std::swap(swapped.segments[0], swapped.segments[1]);
  CHECK(PlanDigest(swapped, 64) != original);
}

TEST_CASE("stats count bytes per rank and link; the floor is the slowest rank's busiest resource") {
  // ZeRO-3 over ranks 0 and 1 of an [8, 4] bf16 tensor into TP1 on both (two replicas):
  // each rank copies its half locally (32 bytes) and receives the other half (32 bytes).
  PlanInput input;
  input.buffers = {Buffer{Holder{0, 0}, 64, ""}, Buffer{Holder{1, 0}, 64, ""}, Buffer{Holder{0, 1}, 64, ""},
                   Buffer{Holder{1, 1}, 64, ""}};
  input.tensors.push_back(TensorLayouts{"w", Index{8, 4}, DType::kBFloat16, DType::kBFloat16,
                                        Zero3(Index{8, 4}, {0, 1}, 0, 0), Replicated(Index{8, 4}, {0, 1}, 1, {0, 0})});
  Plan plan;
  const std::vector<Schedule> schedules = Schedules(input, 1 << 20, &plan);
  const PlanStats stats = ComputeStats(plan, schedules);
  CHECK(stats.ranks[0].sent_bytes == 32);
  CHECK(stats.ranks[0].received_bytes == 32);
  CHECK(stats.ranks[1].local_bytes == 32);
  CHECK(stats.link_bytes.at({0, 1}) == 32);
  CHECK(stats.total_sent_bytes == 64);
  CHECK(stats.rounds == 1);
  // Link: 32 B / 16 B/s = 2 s; memory: 2 * 32 B / 64 B/s = 1 s.
  CHECK(CostFloorSeconds(stats, Bandwidths{16, 64}) == Approx(2.0));
  CHECK(CostFloorSeconds(stats, Bandwidths{64, 16}) == Approx(4.0));
}

}  // namespace
}  // namespace shardsync::planner

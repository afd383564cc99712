// sync --verify's checksums: after a correct sync the source and target sums agree for
// every (tensor, target rank); one changed target, source or fill byte makes exactly
// that tensor and rank disagree; a region's hash does not depend on how it is split, nor
// on whether it is hashed where it lies or packed first.
#include "executor/verify.h"

#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <thread>

#include "executor/mailbox.h"
#include "executor/round_engine.h"
#include "planner/model_layout.h"
#include "planner/schedule.h"
#include "tests/executor/buffer_table.h"
#include "tests/executor/forwarding_device.h"
#include "tests/planner/random_layouts.h"
#include "tests/planner/sync_check.h"

namespace shardsync::executor {
namespace {

// Every rank's checksums, added up over ranks as the coordinator does.
Checksums SumOverRanks(const planner::Plan& plan, const std::vector<planner::Schedule>& schedules,
                       testing::HostBuffers& buffers, int64_t scratch) {
  Checksums total;
  for (int32_t r = 0; r < plan.num_ranks; ++r) {
    HostDevice device;
    auto sums = ComputeChecksums(device, plan, schedules[r], TableFor(r, buffers), scratch);
    REQUIRE(sums.ok());
    for (const auto& [key, side] : *sums) {
      total[key].sources += side.sources;
      total[key].targets += side.targets;
    }
  }
  return total;
}

std::vector<std::pair<std::string, int32_t>> Mismatches(const Checksums& sums) {
  std::vector<std::pair<std::string, int32_t>> out;
  for (const auto& [key, side] : sums) {
    if (side.sources != side.targets) out.push_back(key);
  }
  return out;
}

// Every rank's round engine on its own thread over loopback.
void RunSync(const planner::Plan& plan, const std::vector<planner::Schedule>& schedules,
             testing::HostBuffers& buffers) {
  std::map<int32_t, Mailbox> mailboxes;
  std::map<int32_t, Mailbox*> pointers;
  for (int32_t r = 0; r < plan.num_ranks; ++r) pointers[r] = &mailboxes[r];
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(plan.num_ranks);
  for (int32_t r = 0; r < plan.num_ranks; ++r) {
    threads.emplace_back([&, r] {
      LoopbackTransport transport(r, pointers);
      HostDevice device;
      RoundEngine engine(device, transport);
      results[r] =
          engine
              .Run(
                  {"sync", plan, schedules[r], TableFor(r, buffers), 256, absl::Now() + absl::Seconds(20), nullptr, {}})
              .status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : results) REQUIRE(status.ok());
}

// `plan` scheduled (staging 256 bytes) and synced over random source values.
struct Synced {
  std::vector<planner::Schedule> schedules;
  testing::HostBuffers buffers;
};
Synced SyncRandomValues(const planner::PlanInput& input, const planner::Plan& plan, std::mt19937_64& rng) {
  auto schedules = planner::MakeSchedules(plan, 256);
  REQUIRE(schedules.ok());
  Synced synced{*std::move(schedules), testing::AllocateBuffers(input)};
  testing::PrepareBuffers(input, rng, synced.buffers);
  RunSync(plan, synced.schedules, synced.buffers);
  return synced;
}

// A random model and its plan, or nothing when the plan moves no segment.
struct Planned {
  planner::PlanInput input;
  planner::Plan plan;
};
std::optional<Planned> PlanRandomModel(std::mt19937_64& rng) {
  auto input = planner::ExpandModel(testing::RandomModel(rng));
  REQUIRE(input.ok());
  auto plan = planner::MakePlan(*input, *planner::LocalFirstLeastLoaded());
  REQUIRE(plan.ok());
  if (plan->segments.empty()) return std::nullopt;
  return Planned{*std::move(input), *std::move(plan)};
}

TEST_CASE("checksums agree after a sync; one changed byte names its tensor and target rank") {
  int fills_checked = 0;
  for (uint64_t seed = 1; seed <= 80; ++seed) {
    std::mt19937_64 rng(seed);
    std::optional<Planned> planned = PlanRandomModel(rng);
    if (!planned) continue;
    const planner::Plan* plan = &planned->plan;
    INFO("seed " << seed);
    auto [schedules, buffers] = SyncRandomValues(planned->input, *plan, rng);

    const int64_t scratch = std::vector<int64_t>{1 << 20, 3 << 20, 64 << 20}[seed % 3];
    const Checksums good = SumOverRanks(*plan, schedules, buffers, scratch);
    REQUIRE_FALSE(good.empty());
    CHECK(Mismatches(good).empty());

    // A target element that differs from its source.
    const planner::Segment& s = plan->segments[rng() % plan->segments.size()];
    uint8_t& target = buffers.at(s.dst)[s.dst_base * planner::ElementBytes(s.dst_dtype)];
    target ^= 1;
    const std::pair<std::string, int32_t> key{plan->tensor_names[s.tensor], s.dst.rank};
    CHECK(Mismatches(SumOverRanks(*plan, schedules, buffers, scratch)) == std::vector{key});
    target ^= 1;
    // A source element that changed after the sync (its last value never arrived).
    uint8_t& source =
        buffers.at(s.src)[s.src_base * planner::ElementBytes(s.src_dtype) + planner::ElementBytes(s.src_dtype) - 1];
    source ^= 0x40;
    CHECK_FALSE(Mismatches(SumOverRanks(*plan, schedules, buffers, scratch)).empty());
    source ^= 0x40;
    // Padding that is not zero.
    if (!plan->fills.empty()) {
      const planner::FillOp& f = plan->fills[rng() % plan->fills.size()];
      uint8_t& pad = buffers.at(f.fill.holder)[f.fill.base * planner::ElementBytes(f.dtype)];
      pad ^= 1;
      CHECK(Mismatches(SumOverRanks(*plan, schedules, buffers, scratch)) ==
            std::vector<std::pair<std::string, int32_t>>{{plan->tensor_names[f.tensor], f.fill.holder.rank}});
      pad ^= 1;
      ++fills_checked;
    }
    CHECK(Mismatches(SumOverRanks(*plan, schedules, buffers, scratch)).empty());
  }
  CHECK(fills_checked > 5);
}

TEST_CASE("relayed: a forwarded copy is checked against the relay's target, and the relay's against its sources") {
  const auto policy = planner::LocalFirstLeastLoaded();
  int relayed = 0;
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    std::mt19937_64 rng(seed * 31);
    auto input = planner::ExpandModel(testing::RandomModel(rng));
    REQUIRE(input.ok());
    testing::PlaceOnRandomNodes(*input, 2, rng);
    auto plan = planner::MakePlan(*input, *policy, planner::PlanOptions{true});
    REQUIRE(plan.ok());
    if (plan->stages < 2) continue;
    ++relayed;
    INFO("seed " << seed);
    auto [schedules, buffers] = SyncRandomValues(*input, *plan, rng);
    CHECK(Mismatches(SumOverRanks(*plan, schedules, buffers, 1 << 20)).empty());

    std::vector<const planner::Segment*> forwarded;
    for (const planner::Segment& s : plan->segments) {
      if (s.stage == 1) forwarded.push_back(&s);
    }
    const planner::Segment& s = *forwarded[rng() % forwarded.size()];
    // The forwarded copy changed: only its own (tensor, rank) differs.
    uint8_t& copy = buffers.at(s.dst)[s.dst_base * planner::ElementBytes(s.dst_dtype)];
    copy ^= 1;
    const std::pair<std::string, int32_t> copy_key{plan->tensor_names[s.tensor], s.dst.rank};
    CHECK(Mismatches(SumOverRanks(*plan, schedules, buffers, 1 << 20)) == std::vector{copy_key});
    copy ^= 1;
    // The relay's target changed: the relay differs from its sources (and the copy from it).
    uint8_t& relay = buffers.at(s.src)[s.src_base * planner::ElementBytes(s.src_dtype)];
    relay ^= 1;
    const std::vector<std::pair<std::string, int32_t>> found =
        Mismatches(SumOverRanks(*plan, schedules, buffers, 1 << 20));
    CHECK(std::count(found.begin(), found.end(), std::make_pair(plan->tensor_names[s.tensor], s.src.rank)) == 1);
    CHECK(std::count(found.begin(), found.end(), copy_key) == 1);
    relay ^= 1;
  }
  CHECK(relayed > 10);
}

// A device that counts the bytes it packs and the bytes it hashes.
class CountingDevice final : public testing::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const BufferTable& buffers,
                    uint8_t* out, int slot) override {
    for (const planner::ChunkPart& part : parts) {
      packed += (part.end - part.begin) * planner::ElementBytes(plan.segments[part.segment].dst_dtype);
    }
    return ForwardingDevice::Pack(plan, parts, buffers, out, slot);
  }
  absl::Status QueueHashes(absl::Span<const HashPiece> pieces) override {
    for (const HashPiece& piece : pieces) hashed += piece.bytes;
    return ForwardingDevice::QueueHashes(pieces);
  }

  int64_t packed = 0;
  int64_t hashed = 0;
};

TEST_CASE("regions hashed where they lie sum as they do packed; misaligned ones are packed") {
  int64_t packed_only_when_shifted = 0;  // bytes hashed in place, aligned, and packed, shifted
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    std::mt19937_64 rng(seed * 7);
    std::optional<Planned> planned = PlanRandomModel(rng);
    if (!planned) continue;
    const planner::Plan* plan = &planned->plan;
    INFO("seed " << seed);
    auto [schedules, buffers] = SyncRandomValues(planned->input, *plan, rng);
    // The same bytes one byte past an 8-byte boundary: only regions of 1-byte elements
    // may lie aligned.
    std::map<planner::Holder, std::vector<uint8_t>> shifted;
    std::map<planner::Holder, uint8_t*> shifted_at;
    for (const auto& [holder, bytes] : buffers) {
      std::vector<uint8_t>& copy = shifted[holder];
      copy.assign(bytes.size() + 16, 0);
      uint8_t* at = copy.data() + (8 - reinterpret_cast<uintptr_t>(copy.data()) % 8) % 8 + 1;
      std::copy(bytes.begin(), bytes.end(), at);
      shifted_at[holder] = at;
    }
    for (int32_t r = 0; r < plan->num_ranks; ++r) {
      HostDevice aligned_host, shifted_host;
      CountingDevice aligned_device(aligned_host), shifted_device(shifted_host);
      const absl::StatusOr<Checksums> aligned =
          ComputeChecksums(aligned_device, *plan, schedules[r], TableFor(r, buffers), 1 << 20);
      BufferTable table = TableFor(r, buffers);
      for (const auto& [holder, at] : shifted_at) {
        if (holder.rank == r) table[holder.buffer] = at;
      }
      const absl::StatusOr<Checksums> packed = ComputeChecksums(shifted_device, *plan, schedules[r], table, 1 << 20);
      REQUIRE(aligned.ok());
      REQUIRE(packed.ok());
      CHECK(aligned_device.hashed == shifted_device.hashed);
      CHECK(aligned_device.packed <= shifted_device.packed);
      packed_only_when_shifted += shifted_device.packed - aligned_device.packed;
      REQUIRE(aligned->size() == packed->size());
      for (const auto& [key, side] : *aligned) {
        INFO(key.first << " rank " << key.second);
        CHECK(packed->at(key).sources == side.sources);
        CHECK(packed->at(key).targets == side.targets);
      }
    }
  }
  CHECK(packed_only_when_shifted > 0);
}

TEST_CASE("a region's word-hash sum does not depend on how it is cut into word-aligned pieces") {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> bytes(1003);  // not a whole number of words
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  HostDevice device;
  const auto sum_of = [&](std::vector<HashPiece> pieces) {
    REQUIRE(device.QueueHashes(pieces).ok());
    const absl::StatusOr<std::vector<uint64_t>> sums = device.CollectHashes();
    REQUIRE(sums.ok());
    REQUIRE(sums->size() == pieces.size());
    uint64_t total = 0;
    for (uint64_t s : *sums) total += s;
    return total;
  };
  const int64_t size = static_cast<int64_t>(bytes.size());
  const uint64_t whole = sum_of({{bytes.data(), size, 0}});
  uint64_t defined = 0;  // word_hash.h's definition, word by word, the last zero-padded
  for (int64_t word = 0; word * 8 < size; ++word) {
    uint64_t value = 0;
    for (int64_t b = 0; b < 8 && word * 8 + b < size; ++b) value |= uint64_t{bytes[word * 8 + b]} << (8 * b);
    defined += WordHash(static_cast<uint64_t>(word), value);
  }
  CHECK(whole == defined);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<HashPiece> pieces;
    for (int64_t at = 0; at < size;) {
      const int64_t n = std::min<int64_t>(size - at, 8 * (1 + static_cast<int64_t>(rng() % 9)));
      pieces.push_back({bytes.data() + at, n, at / 8});
      at += n;
    }
    CHECK(sum_of(pieces) == whole);
  }
  std::vector<uint8_t> swapped = bytes;  // two words trade places: the position counts
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 16);
  CHECK(sum_of({{swapped.data(), size, 0}}) != whole);
  std::vector<uint8_t> changed = bytes;
  changed[1001] ^= 1;  // in the zero-padded last word
  CHECK(sum_of({{changed.data(), size, 0}}) != whole);
}

}  // namespace
}  // namespace shardsync::executor

// The coordinator's streamed epoch against the whole plan: every rank's PrepareRequest,
// made later from that rank's segments alone, is byte for byte the one the whole plan's
// schedule encodes; the plan's file has no name, keeps every field of any segment, and its
// errors name the directory (a file that cannot grow too); a file changed under it is refused, saying how.
#include "daemon/coordinator/epoch_plan.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/common/schedule_codec.h"
#include "planner/digest.h"
#include "planner/model_layout.h"
#include "planner/relay.h"
#include "planner/schedule.h"
#include "tests/planner/random_layouts.h"

namespace shardsync::coordinator {
namespace {

std::vector<std::string> BufferNames(const planner::PlanInput& input) {
  std::vector<std::string> names;
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.buffer >= static_cast<int32_t>(names.size())) names.resize(b.holder.buffer + 1);
    names[b.holder.buffer] = absl::StrCat("buffer-", b.holder.buffer);
  }
  return names;
}

TEST_CASE("every rank's schedule made from its own segments is the whole plan's, byte for byte") {
  int ranks_compared = 0;
  int64_t spilled_segments = 0;  // as the file keeps them: once for each rank they name
  int64_t spilled_bytes = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    planner::ModelLayoutSpec spec = testing::RandomModel(rng);
    if (seed % 4 == 0) {
      spec.target_dtype = planner::DType::kFloat8E4M3;
      for (planner::ModelTensor& t : spec.tensors) t.dtype = planner::DType::kBFloat16;
    }
    absl::StatusOr<planner::PlanInput> input = planner::ExpandModel(spec);
    REQUIRE(input.ok());
    if (seed % 2 == 1) testing::PlaceOnRandomNodes(*input, 2 + seed % 3, rng);
    EpochOptions options;
    for (const planner::Buffer& b : input->buffers)
      options.world_size = std::max(options.world_size, b.holder.rank + 2);
    options.relay = seed % 3 == 0 ? planner::RelayMode::kNever : planner::RelayMode::kAuto;
    options.bandwidths = planner::Bandwidths{100e9, 1000e9, 5e9};
    options.staging_bytes = seed % 2 == 0 ? 4096 : int64_t{1} << 20;
    options.plan_dir = std::getenv("TEST_TMPDIR");
    INFO("seed " << seed);
    const std::vector<std::string> names = BufferNames(*input);
    absl::StatusOr<EpochPlan> epoch = CompileEpoch(*input, names, options);
    REQUIRE(epoch.ok());

    absl::StatusOr<planner::Plan> whole = planner::MakePlanWithRelay(
        *input, *planner::LocalFirstLeastLoaded(), options.relay, options.bandwidths, nullptr, options.scratch_bytes);
    REQUIRE(whole.ok());
    whole->num_ranks = options.world_size;
    absl::StatusOr<std::vector<planner::Schedule>> schedules = planner::MakeSchedules(*whole, options.staging_bytes);
    REQUIRE(schedules.ok());
    CHECK(epoch->digest() == planner::PlanDigest(*whole, options.staging_bytes));
    CHECK(epoch->planned.stats.segments == static_cast<int64_t>(whole->segments.size()));
    for (const planner::Segment& segment : whole->segments)
      spilled_segments += segment.src.rank == segment.dst.rank ? 1 : 2;
    spilled_bytes += epoch->segments->file_bytes();
    for (int32_t rank = 0; rank < options.world_size; ++rank) {
      const absl::StatusOr<v1::PrepareRequest> request = ScheduleRequest(*epoch, rank);
      REQUIRE(request.ok());
      const v1::PrepareRequest expected = daemon::EncodeSchedule(*whole, (*schedules)[rank], names);
      CHECK(request->SerializeAsString() == expected.SerializeAsString());
      ++ranks_compared;
    }
  }
  CHECK(ranks_compared > 60);
  // A rank's segments mostly continue each other: the file keeps them in a third of
  // what they take in memory (15 bytes a segment here).
  CHECK(spilled_bytes * 3 < spilled_segments * static_cast<int64_t>(sizeof(planner::Segment)));
}

TEST_CASE("the plan's file has no name, and a directory it cannot use is named") {
  const std::string dir = std::getenv("TEST_TMPDIR");
  absl::StatusOr<std::unique_ptr<SegmentSpill>> spill = SegmentSpill::Create(dir, 2);
  REQUIRE(spill.ok());
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    CHECK(entry.path().filename().string().rfind("shardsync-plan-", 0) != 0);
  }
  planner::Segment s;
  s.src.rank = 0;
  s.dst.rank = 1;
  s.axes = 1;
  s.shape[0] = s.src_strides[0] = s.dst_strides[0] = 1;
  const size_t count = SegmentSpill::kBlockBytes / 4;  // several blocks: each segment takes 14 bytes or more
  for (size_t i = 0; i < count; ++i) {
    s.src_base = static_cast<int64_t>(i);
    REQUIRE((*spill)->Add(absl::MakeConstSpan(&s, 1)).ok());
  }
  planner::Segment no_axes = s;  // the planner never makes one
  no_axes.axes = 0;
  CHECK((*spill)->Add(absl::MakeConstSpan(&no_axes, 1)).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE((*spill)->Finish().ok());
  CHECK((*spill)->file_bytes() > 4 * static_cast<int64_t>(SegmentSpill::kBlockBytes));  // two blocks a rank or more
  for (int32_t rank : {0, 1}) {
    const absl::StatusOr<planner::BlockVector<planner::Segment>> read = (*spill)->Read(rank);
    REQUIRE(read.ok());
    REQUIRE(read->size() == count);
    for (size_t i = 0; i < read->size(); ++i) CHECK((*read)[i].src_base == static_cast<int64_t>(i));
  }
  CHECK((*spill)->Read(2).status().code() == absl::StatusCode::kInvalidArgument);

  const absl::StatusOr<std::unique_ptr<SegmentSpill>> missing = SegmentSpill::Create(dir + "/no-such-dir", 2);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(missing.status().message()), Catch::Matchers::Contains(dir + "/no-such-dir"));
}

TEST_CASE("a plan's file that cannot grow fails the plan, naming its directory") {
  const std::string dir = std::getenv("TEST_TMPDIR");
  absl::StatusOr<std::unique_ptr<SegmentSpill>> spill = SegmentSpill::Create(dir, 2);
  REQUIRE(spill.ok());
  planner::Segment s;
  s.dst.rank = 1;
  s.axes = 1;
  s.shape[0] = s.src_strides[0] = s.dst_strides[0] = 1;
  // As on a full disk: this process may write no file past 64 KiB (ulimit -f), and a
  // write past it fails with EFBIG instead of the signal that would end the process.
  rlimit before{};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &before) == 0);
  const rlimit small{SegmentSpill::kBlockBytes, before.rlim_max};
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  const sighandler_t was = signal(SIGXFSZ, SIG_IGN);
  absl::Status status;
  for (int64_t i = 0; status.ok() && i < 4 * static_cast<int64_t>(SegmentSpill::kBlockBytes); ++i) {
    s.src_base = i;
    status = (*spill)->Add(absl::MakeConstSpan(&s, 1));
  }
  if (status.ok()) status = (*spill)->Finish();
  setrlimit(RLIMIT_FSIZE, &before);
  signal(SIGXFSZ, was);
  CHECK(status.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(status.message()),
             Catch::Matchers::StartsWith(absl::StrCat("writing the plan's file in '", dir, "' at ")) &&
                 Catch::Matchers::EndsWith(std::strerror(EFBIG)));
}

// The descriptor of the one plan's file open in this process, found as its link in
// /proc/self/fd names it: the file has no other name.
int PlanFileDescriptor() {
  int found = -1;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.find("/shardsync-plan-") != std::string::npos) {
      REQUIRE(found == -1);
      found = std::stoi(entry.path().filename().string());
    }
  }
  REQUIRE(found >= 0);
  return found;
}

TEST_CASE("a plan's file changed under the coordinator is refused, saying how") {
  // Each segment takes 15 bytes (its base steps by 1,000: a two-byte varint).
  const auto spilled = [] {
    absl::StatusOr<std::unique_ptr<SegmentSpill>> spill = SegmentSpill::Create(std::getenv("TEST_TMPDIR"), 2);
    REQUIRE(spill.ok());
    planner::Segment s;
    s.src.rank = 0;
    s.dst.rank = 1;
    s.axes = 1;
    s.shape[0] = s.src_strides[0] = s.dst_strides[0] = 1;
    for (int64_t i = 0; i < static_cast<int64_t>(SegmentSpill::kBlockBytes / 8); ++i) {
      s.src_base = i * 1000;
      REQUIRE((*spill)->Add(absl::MakeConstSpan(&s, 1)).ok());
    }
    REQUIRE((*spill)->Finish().ok());
    REQUIRE((*spill)->Read(0).ok());
    return std::move(*spill);
  };
  // Rank 0's first block starts the file: `first`, then `rest`, over its first
  // kBlockBytes bytes (rank 1's block follows it).
  const auto overwrite = [](std::vector<uint8_t> first, uint8_t rest) {
    first.resize(SegmentSpill::kBlockBytes, rest);
    REQUIRE(pwrite(PlanFileDescriptor(), first.data(), first.size(), 0) == static_cast<ssize_t>(first.size()));
  };
  const auto refused = [](const SegmentSpill& spill, const std::string& why) {
    const absl::StatusOr<planner::BlockVector<planner::Segment>> read = spill.Read(0);
    REQUIRE_FALSE(read.ok());
    CHECK(read.status().code() == absl::StatusCode::kInternal);
    const std::string message(read.status().message());
    CHECK_THAT(message, Catch::Matchers::Contains("rank 0's segments") &&
                            Catch::Matchers::Contains(std::getenv("TEST_TMPDIR")) && Catch::Matchers::Contains(why));
    CHECK(spill.Read(1).ok());  // rank 1's blocks are untouched, except by truncation
  };
  SECTION("truncated") {
    const std::unique_ptr<SegmentSpill> spill = spilled();
    REQUIRE(ftruncate(PlanFileDescriptor(), 100) == 0);
    const absl::StatusOr<planner::BlockVector<planner::Segment>> read = spill->Read(0);
    REQUIRE_FALSE(read.ok());
    CHECK_THAT(std::string(read.status().message()), Catch::Matchers::Contains("short file"));
  }
  SECTION("a varint that never ends") {
    const std::unique_ptr<SegmentSpill> spill = spilled();
    overwrite({}, 0xff);
    refused(*spill, "the bytes end inside a segment");
  }
  SECTION("a segment of no axes") {
    const std::unique_ptr<SegmentSpill> spill = spilled();
    overwrite({}, 0);
    refused(*spill, "a segment of 0 axes");
  }
  SECTION("segments shorter than their block") {
    const std::unique_ptr<SegmentSpill> spill = spilled();
    // A segment of one axis in 14 one-byte fields, then the same again and again: the
    // block's segments end before its bytes.
    overwrite({0, 0, 2, 0, 0, 0, 0, 2, 0, 0, 0, 2, 2, 2}, 0);
    refused(*spill, "a block is longer than its segments");
  }
}

TEST_CASE("the plan's file gives back every field of any segment, each rank's in order") {
  std::mt19937_64 random(7);
  const auto pick = [&random](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(random);
  };
  // Extremes beside small steps: the differences a block keeps wrap both ways.
  const auto any_base = [&] {
    switch (pick(0, 3)) {
      case 0:
        return std::numeric_limits<int64_t>::max() - pick(0, 3);
      case 1:
        return std::numeric_limits<int64_t>::min() + pick(0, 3);
      case 2:
        return pick(0, 1 << 20);
      default:
        return pick(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    }
  };
  const auto any_axis = [&] {
    return static_cast<planner::SegmentAxis>(
        pick(0, 1) ? pick(1, 64) : pick(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
  };
  constexpr int32_t kRanks = 3;
  absl::StatusOr<std::unique_ptr<SegmentSpill>> spill = SegmentSpill::Create(std::getenv("TEST_TMPDIR"), kRanks);
  REQUIRE(spill.ok());
  std::vector<std::vector<planner::Segment>> expected(kRanks);
  for (int i = 0; i < 6000; ++i) {
    planner::Segment s;
    s.src = {static_cast<int32_t>(pick(0, kRanks - 1)), static_cast<int32_t>(pick(0, 1'000'000))};
    s.dst = {static_cast<int32_t>(pick(0, kRanks - 1)), static_cast<int32_t>(pick(0, 1'000'000))};
    s.src_base = any_base();
    s.dst_base = any_base();
    s.tensor = static_cast<int32_t>(pick(0, std::numeric_limits<int32_t>::max()));
    s.src_dtype = static_cast<planner::DType>(pick(0, 8));
    s.dst_dtype = static_cast<planner::DType>(pick(0, 8));
    s.axes = static_cast<int8_t>(pick(1, planner::kMaxAxes));
    s.stage = static_cast<int8_t>(pick(0, 127));
    for (int k = 0; k < s.axes; ++k) {
      s.shape[k] = any_axis();
      s.src_strides[k] = any_axis();
      s.dst_strides[k] = any_axis();
    }
    REQUIRE((*spill)->Add(absl::MakeConstSpan(&s, 1)).ok());
    expected[s.src.rank].push_back(s);
    if (s.dst.rank != s.src.rank) expected[s.dst.rank].push_back(s);
  }
  REQUIRE((*spill)->Finish().ok());
  CHECK((*spill)->file_bytes() > 2 * kRanks * static_cast<int64_t>(SegmentSpill::kBlockBytes));  // several blocks
  for (int32_t rank = 0; rank < kRanks; ++rank) {
    const absl::StatusOr<planner::BlockVector<planner::Segment>> read = (*spill)->Read(rank);
    REQUIRE(read.ok());
    REQUIRE(read->size() == expected[rank].size());
    for (size_t i = 0; i < read->size(); ++i) {
      const planner::Segment& got = (*read)[i];
      const planner::Segment& want = expected[rank][i];
      INFO("rank " << rank << ", segment " << i);
      REQUIRE(std::memcmp(&got, &want, sizeof(planner::Segment)) == 0);
    }
  }
}

}  // namespace
}  // namespace shardsync::coordinator

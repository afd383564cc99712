// Delta encoding: applied onto the baseline it gives back the current bytes, bit for
// bit, at every change fraction and length, with the changes a float comparison would
// miss (-0.0 for +0.0, another NaN payload, denormals); it costs no more than the raw
// bytes plus a byte a block; a malformed encoding is refused before anything is written.
// Snapshots: found only for their plan, chunk, sync and size, else say why not.
#include "executor/delta_codec.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "executor/delta_snapshots.h"

namespace shardsync::executor {
namespace {

using Catch::Matchers::Contains;

std::vector<uint8_t> RandomBytes(int64_t bytes, std::mt19937_64& rng) {
  std::vector<uint8_t> out(bytes);
  for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// `baseline` with about `fraction` of its 16-bit words changed, each to another value:
// only in its first byte (a small step of a bfloat16: mantissa bits), or anywhere.
std::vector<uint8_t> Changed(const std::vector<uint8_t>& baseline, double fraction, std::mt19937_64& rng,
                             bool first_byte_only = false) {
  std::vector<uint8_t> out = baseline;
  std::bernoulli_distribution pick(fraction);
  for (size_t k = 0; k < out.size(); k += 2) {
    if (!pick(rng)) continue;
    const bool both = !first_byte_only && k + 1 < out.size() && rng() % 2 == 0;
    out[k + (both ? 1 : 0)] ^= static_cast<uint8_t>(1 + rng() % 255);  // never the same
    if (both && rng() % 2 == 0) out[k] ^= static_cast<uint8_t>(rng());
  }
  return out;
}

void CheckRoundTrip(const std::vector<uint8_t>& baseline, const std::vector<uint8_t>& current) {
  std::string encoded;
  const DeltaCounts counts =
      EncodeDelta(current.data(), baseline.data(), static_cast<int64_t>(current.size()), encoded);
  const int64_t blocks = (static_cast<int64_t>(current.size()) + kDeltaBlockBytes - 1) / kDeltaBlockBytes;
  CHECK(counts.encoded_bytes == static_cast<int64_t>(encoded.size()));
  CHECK(counts.encoded_bytes <= static_cast<int64_t>(current.size()) + blocks);
  std::vector<uint8_t> applied = baseline;
  const absl::Status status =
      ApplyDelta(reinterpret_cast<const uint8_t*>(encoded.data()), static_cast<int64_t>(encoded.size()), applied.data(),
                 static_cast<int64_t>(applied.size()));
  REQUIRE(status.ok());
  REQUIRE(applied == current);
  int64_t changed = 0;
  for (size_t k = 0; k < current.size(); k += 2) {
    changed += std::memcmp(&current[k], &baseline[k], std::min<size_t>(2, current.size() - k)) != 0;
  }
  CHECK(counts.changed_words == changed);
}

TEST_CASE("a delta applied onto its baseline gives the current bytes at every fraction and length") {
  std::mt19937_64 rng(21);
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{4095}, int64_t{4096}, int64_t{4097},
                        int64_t{3 * 4096 + 1001}, int64_t{1} << 20}) {
    for (double fraction : {0.0, 0.001, 0.01, 0.1, 0.5, 1.0}) {
      INFO(bytes << " bytes, " << fraction << " changed");
      const std::vector<uint8_t> baseline = RandomBytes(bytes, rng);
      CheckRoundTrip(baseline, Changed(baseline, fraction, rng));
      CheckRoundTrip(baseline, Changed(baseline, fraction, rng, /*first_byte_only=*/true));
    }
  }
}

TEST_CASE("the encoding shrinks with the change: nothing for none, about 3 bytes a word for a few, raw for all") {
  std::mt19937_64 rng(22);
  const std::vector<uint8_t> baseline = RandomBytes(1 << 20, rng);
  const auto encoded_bytes = [&](const std::vector<uint8_t>& current) {
    std::string out;
    return EncodeDelta(current.data(), baseline.data(), static_cast<int64_t>(current.size()), out);
  };
  const DeltaCounts none = encoded_bytes(baseline);
  CHECK(none.encoded_bytes == 256);  // a mode byte per block
  CHECK(none.blocks[static_cast<int>(DeltaMode::kUnchanged)] == 256);
  // 1% of the words, in random places: a byte of gap and two of value each.
  const DeltaCounts few = encoded_bytes(Changed(baseline, 0.01, rng));
  CHECK(few.encoded_bytes < 256 * 3 + 3 * few.changed_words + 256 * 2 * 3);
  CHECK(few.blocks[static_cast<int>(DeltaMode::kGaps)] == 256);
  CHECK(few.low_byte_blocks == 0);
  // The same where only first bytes change (bfloat16 steps in the mantissa): one of value.
  const DeltaCounts small_steps = encoded_bytes(Changed(baseline, 0.01, rng, /*first_byte_only=*/true));
  CHECK(small_steps.encoded_bytes < 256 * 3 + 2 * small_steps.changed_words + 256 * 2 * 2);
  CHECK(small_steps.low_byte_blocks == 256);
  // Very few: indices beat gaps past 255 words.
  std::vector<uint8_t> sparse = baseline;
  for (size_t k = 0; k < sparse.size(); k += 1200) sparse[k + 1] ^= 0x40;
  const DeltaCounts apart = encoded_bytes(sparse);
  CHECK(apart.blocks[static_cast<int>(DeltaMode::kIndices)] > 0);
  const DeltaCounts half = encoded_bytes(Changed(baseline, 0.5, rng));
  CHECK(half.blocks[static_cast<int>(DeltaMode::kBitmask)] == 256);
  CHECK(half.encoded_bytes < (1 << 20));
  const DeltaCounts all = encoded_bytes(Changed(baseline, 1.0, rng));
  CHECK(all.blocks[static_cast<int>(DeltaMode::kRaw)] == 256);
  CHECK(all.encoded_bytes == (1 << 20) + 256);
}

TEST_CASE("bit patterns, not values: -0.0, another NaN payload and denormals are changes") {
  // bfloat16 words: +0.0 -> -0.0, a quiet NaN -> another payload, a denormal -> its
  // neighbour, and a float32 whose low half alone changes.
  std::vector<uint8_t> baseline(64, 0), current(64, 0);
  const uint16_t before[] = {0x0000, 0x7fc0, 0x0001, 0x3f80, 0x1234};
  const uint16_t after[] = {0x8000, 0x7fc1, 0x0002, 0x3f80, 0x1235};
  std::memcpy(baseline.data(), before, sizeof(before));
  std::memcpy(current.data(), after, sizeof(after));
  std::string encoded;
  const DeltaCounts counts = EncodeDelta(current.data(), baseline.data(), 64, encoded);
  CHECK(counts.changed_words == 4);
  CheckRoundTrip(baseline, current);
}

TEST_CASE("a malformed encoding is refused before the baseline is touched") {
  std::mt19937_64 rng(23);
  const std::vector<uint8_t> baseline = RandomBytes(3 * 4096 + 5, rng);
  const std::vector<uint8_t> current = Changed(baseline, 0.01, rng);
  std::string encoded;
  EncodeDelta(current.data(), baseline.data(), static_cast<int64_t>(current.size()), encoded);
  const auto apply = [&](const std::string& bytes) {
    std::vector<uint8_t> data = baseline;
    const absl::Status status =
        ApplyDelta(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int64_t>(bytes.size()), data.data(),
                   static_cast<int64_t>(data.size()));
    if (!status.ok()) CHECK(data == baseline);
    return status;
  };
  CHECK_THAT(std::string(apply(encoded.substr(0, encoded.size() - 1)).message()), Contains("ends at byte"));
  CHECK_THAT(std::string(apply(encoded + "x").message()), Contains("past its end"));
  std::string unknown = encoded;
  unknown[0] = 9;
  CHECK_THAT(std::string(apply(unknown).message()), Contains("mode 9 is unknown"));
  unknown[0] = static_cast<char>(static_cast<uint8_t>(DeltaMode::kRaw) | kLowBytes);
  CHECK_THAT(std::string(apply(unknown).message()), Contains("is unknown"));
  // A gap that runs past the block: the first block as gaps, one changed word at 2048.
  std::string past(1, static_cast<char>(DeltaMode::kGaps));
  past += std::string("\x01\x00\xff\x00\x08", 5);  // count 1, gap 2048 (escaped)
  past += "ab";
  std::vector<uint8_t> one_block = RandomBytes(4096, rng);
  CHECK_THAT(std::string(ApplyDelta(reinterpret_cast<const uint8_t*>(past.data()), static_cast<int64_t>(past.size()),
                                    one_block.data(), 4096)
                             .message()),
             Contains("index 2048 is out of order or past a 2048-word block"));
  // Any single byte changed, and any truncation: refused, or applied within bounds; of
  // an encoding with whole values and of one with first bytes.
  std::string small_steps;
  EncodeDelta(Changed(baseline, 0.01, rng, /*first_byte_only=*/true).data(), baseline.data(),
              static_cast<int64_t>(baseline.size()), small_steps);
  for (const std::string& valid : {encoded, small_steps}) {
    for (size_t k = 0; k < valid.size(); ++k) {
      std::string mutated = valid;
      mutated[k] = static_cast<char>(mutated[k] ^ (1 + rng() % 255));
      (void)apply(mutated);
      (void)apply(valid.substr(0, k));
    }
  }
}

TEST_CASE("a snapshot is found only for its plan, chunk, sync and size; otherwise it says why not") {
  DeltaSnapshots snapshots(64);
  const uint8_t chunk[48] = {7};
  // A new process: nothing kept before its first sync, also once that sync kept some.
  CHECK(std::string(snapshots.Find("sync-1", "plan-a", 1, 0, "sync-0", 48).missing) == "restarted_agent");
  REQUIRE(snapshots.Keep("plan-a", 1, 0, "sync-1", chunk, 48));
  CHECK(std::string(snapshots.Find("sync-1", "plan-a", 2, 0, "sync-0", 48).missing) == "restarted_agent");
  // The next sync finds sync-1's chunk, and nothing else.
  const SnapshotLookup found = snapshots.Find("sync-2", "plan-a", 1, 0, "sync-1", 48);
  REQUIRE(found.data != nullptr);
  CHECK(std::memcmp(found.data->data(), chunk, 48) == 0);
  CHECK(std::string(snapshots.Find("sync-2", "plan-a", 1, 0, "sync-0", 48).missing) == "stale_snapshot");
  CHECK(std::string(snapshots.Find("sync-2", "plan-a", 1, 0, "sync-1", 40).missing) == "stale_snapshot");
  CHECK(std::string(snapshots.Find("sync-2", "plan-a", 2, 0, "sync-1", 48).missing) == "stale_snapshot");
  CHECK(std::string(snapshots.Find("sync-2", "plan-b", 1, 0, "sync-1", 48).missing) == "new_epoch");
  // 48 + 48 bytes do not fit 64: the second chunk goes whole until it fits again.
  CHECK_FALSE(snapshots.Keep("plan-a", 2, 0, "sync-2", chunk, 48));
  CHECK(std::string(snapshots.Find("sync-3", "plan-a", 2, 0, "sync-2", 48).missing) == "over_budget");
  CHECK(snapshots.bytes() == 48);
  REQUIRE(snapshots.Keep("plan-a", 2, 0, "sync-3", chunk, 16));
  CHECK(snapshots.Find("sync-4", "plan-a", 2, 0, "sync-3", 16).data != nullptr);
  // Another plan drops every snapshot of the one before: its first sync finds none, even
  // once it kept some; the sync after finds them.
  REQUIRE(snapshots.Keep("plan-b", 1, 0, "sync-4", chunk, 8));
  CHECK(snapshots.bytes() == 8);
  CHECK(std::string(snapshots.Find("sync-4", "plan-b", 2, 0, "sync-3", 16).missing) == "new_epoch");
  CHECK(snapshots.Find("sync-5", "plan-b", 1, 0, "sync-4", 8).data != nullptr);
  CHECK(std::string(snapshots.Find("sync-5", "plan-b", 2, 0, "sync-4", 16).missing) == "stale_snapshot");
}

}  // namespace
}  // namespace shardsync::executor

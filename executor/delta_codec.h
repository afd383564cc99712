// Delta encoding of one stretch of bytes against a baseline: what a sender's chunk
// became since the receiver's copy of it. Bit patterns are compared as 16-bit words
// (bfloat16 elements; never float equality, so -0.0, NaN payloads and denormals are
// changes like any other), in blocks of kDeltaBlockBytes; each block is sent the
// smallest way: not at all (unchanged), raw, or as where the changed words are and
// their values. The encoding holds no baseline: the receiver applies it onto its own
// copy, which must hold the same bytes.
//
// Format, per block in order: one mode byte, then
//   kUnchanged: nothing;
//   kRaw: the block's bytes;
//   otherwise where the changed words are, then their values:
//     kBitmask: one bit per word (bit k of byte k / 8);
//     kIndices: a little-endian uint16 count, that many uint16 word indices ascending;
//     kGaps: a uint16 count, then per changed word the words skipped since the one
//            before (the first: since the block's start) in one byte, or 0xFF and a
//            uint16 when 255 or more;
//   and with kLowBytes set in the mode byte (every changed word kept its high byte,
//   as a small step of a bfloat16 does) one byte per changed word, its new first
//   byte; else the changed words whole.
// The last block may be short; an odd last byte is a word of its own (one byte of value).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardsync::executor {

inline constexpr int64_t kDeltaBlockBytes = 4096;

enum class DeltaMode : uint8_t { kUnchanged = 0, kRaw = 1, kBitmask = 2, kIndices = 3, kGaps = 4 };
inline constexpr uint8_t kLowBytes = 0x10;  // in a mode byte: values are the words' first bytes

struct DeltaCounts {
  int64_t changed_words = 0;            // 16-bit words whose bits differ
  int64_t encoded_bytes = 0;            // what was appended
  int64_t blocks[5] = {0, 0, 0, 0, 0};  // by DeltaMode
  int64_t low_byte_blocks = 0;          // of those, with kLowBytes
};

// Appends the encoding of `current` against `baseline` (both `bytes` long) to `out`.
DeltaCounts EncodeDelta(const uint8_t* current, const uint8_t* baseline, int64_t bytes, std::string& out);

// Applies an encoding of exactly `bytes` bytes onto `data` (which holds the baseline),
// in place. A malformed encoding (truncated, past the end, indices not ascending,
// trailing bytes) is refused with INVALID_ARGUMENT before `data` is touched.
absl::Status ApplyDelta(const uint8_t* encoded, int64_t encoded_bytes, uint8_t* data, int64_t bytes);

}  // namespace shardsync::executor

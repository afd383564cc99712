// Delta encoding of one stretch of bytes against a baseline: what a sender's chunk
// became since the receiver's copy of it. Bit patterns are compared as 16-bit words
// (bfloat16 elements; never float equality, so -0.0, NaN payloads and denormals are
// changes like any other), in blocks of kDeltaBlockBytes; each block is sent the
// smallest way: not at all (unchanged), as a bitmask of changed words and their
// values, as the changed words' indices and values, or raw. The encoding holds no
// baseline: the receiver applies it onto its own copy, which must hold the same bytes.
//
// Format, per block in order: one mode byte, then
//   kUnchanged: nothing;
//   kRaw: the block's bytes;
//   kBitmask: one bit per word (bit k of byte k / 8), then the changed words;
//   kIndices: a little-endian uint16 count, that many uint16 word indices ascending,
//             then the changed words.
// The last block may be short; an odd last byte is a word of its own (sent raw when it
// changed).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace shardsync::executor {

inline constexpr int64_t kDeltaBlockBytes = 4096;

enum class DeltaMode : uint8_t { kUnchanged = 0, kRaw = 1, kBitmask = 2, kIndices = 3 };

struct DeltaCounts {
  int64_t changed_words = 0;         // 16-bit words whose bits differ
  int64_t encoded_bytes = 0;         // what was appended
  int64_t blocks[4] = {0, 0, 0, 0};  // by DeltaMode
};

// Appends the encoding of `current` against `baseline` (both `bytes` long) to `out`.
DeltaCounts EncodeDelta(const uint8_t* current, const uint8_t* baseline, int64_t bytes, std::string& out);

// Applies an encoding of exactly `bytes` bytes onto `data` (which holds the baseline),
// in place. A malformed encoding (truncated, past the end, indices not ascending,
// trailing bytes) is refused with INVALID_ARGUMENT before `data` is touched.
absl::Status ApplyDelta(const uint8_t* encoded, int64_t encoded_bytes, uint8_t* data, int64_t bytes);

}  // namespace shardsync::executor

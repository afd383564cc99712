#include "executor/delta_codec.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace shardsync::executor {
namespace {

constexpr int64_t kWordBytes = 2;
constexpr uint8_t kGapEscape = 0xFF;  // a gap of 255 or more follows as a uint16

int64_t WordsOf(int64_t block_bytes) { return (block_bytes + kWordBytes - 1) / kWordBytes; }

// Word k of a block of `block_bytes` (the odd last byte alone).
int64_t WordLength(int64_t k, int64_t block_bytes) { return std::min(kWordBytes, block_bytes - k * kWordBytes); }

void AppendUint16(std::string& out, uint16_t value) {
  out.push_back(static_cast<char>(value & 0xff));
  out.push_back(static_cast<char>(value >> 8));
}

uint16_t ReadUint16(const uint8_t* at) { return static_cast<uint16_t>(at[0] | (at[1] << 8)); }

// The words skipped before changed word `k`, after `previous` (-1 at the block's start).
int64_t Gap(int64_t k, int64_t previous) { return k - previous - 1; }
int64_t GapBytes(int64_t gap) { return gap < kGapEscape ? 1 : 3; }

// One block's changed words: their indices, and whether any changed its second byte.
struct Changes {
  uint16_t index[kDeltaBlockBytes / kWordBytes];
  int64_t count = 0;
  bool high_changed = false;
};

void FindChanges(const uint8_t* now, const uint8_t* before, int64_t block_bytes, Changes& changes) {
  changes.count = 0;
  uint64_t high = 0;  // second bytes of changed words that differ
  const int64_t words = WordsOf(block_bytes);
  int64_t k = 0;
  // Four words at a time (without branches on which), then what is left one at a time.
  for (; (k + 4) * kWordBytes <= block_bytes; k += 4) {
    uint64_t a, b;
    std::memcpy(&a, now + k * kWordBytes, 8);
    std::memcpy(&b, before + k * kWordBytes, 8);
    const uint64_t differ = a ^ b;
    if (differ == 0) continue;
    high |= differ & 0xff00ff00ff00ff00u;
    for (int j = 0; j < 4; ++j) {
      changes.index[changes.count] = static_cast<uint16_t>(k + j);
      changes.count += ((differ >> (16 * j)) & 0xffffu) != 0;
    }
  }
  for (; k < words; ++k) {
    const int64_t at = k * kWordBytes;
    const bool low = now[at] != before[at];
    const bool second = WordLength(k, block_bytes) == 2 && now[at + 1] != before[at + 1];
    if (low || second) changes.index[changes.count++] = static_cast<uint16_t>(k);
    high |= second ? 1 : 0;
  }
  changes.high_changed = high != 0;
}

}  // namespace

DeltaCounts EncodeDelta(const uint8_t* current, const uint8_t* baseline, int64_t bytes, std::string& out) {
  DeltaCounts counts;
  const size_t start = out.size();
  Changes changes;
  std::string bits;
  for (int64_t at = 0; at < bytes; at += kDeltaBlockBytes) {
    const int64_t block_bytes = std::min(kDeltaBlockBytes, bytes - at);
    const uint8_t* now = current + at;
    FindChanges(now, baseline + at, block_bytes, changes);
    const int64_t n = changes.count;
    const uint16_t* changed = changes.index;
    counts.changed_words += n;
    const int64_t words = WordsOf(block_bytes);
    const bool last_changed = n > 0 && changed[n - 1] == words - 1;
    const bool low = !changes.high_changed;
    const int64_t value_bytes = low ? n : kWordBytes * n - (block_bytes % kWordBytes != 0 && last_changed ? 1 : 0);
    const int64_t mask_bytes = (words + 7) / 8;
    int64_t gaps = 2 + n;  // at least a byte a word: counted only where that could beat the mask
    if (gaps < mask_bytes) {
      gaps = 2;
      for (int64_t i = 0, previous = -1; i < n; previous = changed[i++]) gaps += GapBytes(Gap(changed[i], previous));
    }
    const int64_t where[] = {mask_bytes, 2 + 2 * n, gaps};  // kBitmask, kIndices, kGaps
    const int64_t best = std::min_element(where, where + 3) - where;
    DeltaMode mode = DeltaMode::kRaw;
    if (n == 0) {
      mode = DeltaMode::kUnchanged;
    } else if (where[best] + value_bytes < block_bytes) {
      mode = static_cast<DeltaMode>(static_cast<int>(DeltaMode::kBitmask) + best);
    }
    ++counts.blocks[static_cast<int>(mode)];
    const bool low_bytes = low && mode != DeltaMode::kUnchanged && mode != DeltaMode::kRaw;
    counts.low_byte_blocks += low_bytes ? 1 : 0;
    out.push_back(static_cast<char>(static_cast<uint8_t>(mode) | (low_bytes ? kLowBytes : 0)));
    if (mode == DeltaMode::kUnchanged) continue;
    if (mode == DeltaMode::kRaw) {
      out.append(reinterpret_cast<const char*>(now), block_bytes);
      continue;
    }
    if (mode == DeltaMode::kBitmask) {
      bits.assign((words + 7) / 8, '\0');
      for (int64_t i = 0; i < n; ++i)
        bits[changed[i] / 8] = static_cast<char>(bits[changed[i] / 8] | (1 << (changed[i] % 8)));
      out += bits;
    } else if (mode == DeltaMode::kIndices) {
      AppendUint16(out, static_cast<uint16_t>(n));
      for (int64_t i = 0; i < n; ++i) AppendUint16(out, changed[i]);
    } else {
      AppendUint16(out, static_cast<uint16_t>(n));
      for (int64_t i = 0, previous = -1; i < n; previous = changed[i++]) {
        const int64_t gap = Gap(changed[i], previous);
        if (gap < kGapEscape) {
          out.push_back(static_cast<char>(gap));
        } else {
          out.push_back(static_cast<char>(kGapEscape));
          AppendUint16(out, static_cast<uint16_t>(gap));
        }
      }
    }
    const size_t values_at = out.size();
    out.resize(values_at + value_bytes);
    uint8_t* value = reinterpret_cast<uint8_t*>(&out[values_at]);
    if (low) {
      for (int64_t i = 0; i < n; ++i) value[i] = now[changed[i] * kWordBytes];
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* word = now + changed[i] * kWordBytes;
        if (WordLength(changed[i], block_bytes) == kWordBytes) {
          std::memcpy(value, word, kWordBytes);  // a fixed size: no call
          value += kWordBytes;
        } else {
          *value++ = *word;  // the odd last byte
        }
      }
    }
  }
  counts.encoded_bytes = static_cast<int64_t>(out.size() - start);
  return counts;
}

namespace {

// One block's changes, pointing into the encoding.
struct BlockChanges {
  DeltaMode mode = DeltaMode::kUnchanged;
  bool low_bytes = false;           // values are the words' first bytes
  const uint8_t* where = nullptr;   // kBitmask: the mask; kIndices: the indices; kGaps: the gaps
  int64_t count = 0;                // changed words
  const uint8_t* values = nullptr;  // kRaw: the block
};

// Reads the block at `at` of a block of `block_bytes`, advancing `at`.
absl::Status ReadBlock(const uint8_t* encoded, int64_t encoded_bytes, int64_t& at, int64_t block_bytes,
                       BlockChanges& block) {
  const auto need = [&](int64_t n) -> absl::Status {
    if (encoded_bytes - at < n) {
      return absl::InvalidArgumentError(absl::StrCat("delta encoding ends at byte ", encoded_bytes, " inside a block (",
                                                     n, " more bytes needed at ", at, ")"));
    }
    return absl::OkStatus();
  };
  if (auto s = need(1); !s.ok()) return s;
  const uint8_t mode_byte = encoded[at++];
  const uint8_t mode = mode_byte & ~kLowBytes;
  block.low_bytes = (mode_byte & kLowBytes) != 0;
  const int64_t words = WordsOf(block_bytes);
  const bool odd = block_bytes % kWordBytes != 0;  // the last word is one byte
  bool last_changed = false;
  block.count = 0;
  if (block.low_bytes &&
      (mode == static_cast<uint8_t>(DeltaMode::kUnchanged) || mode == static_cast<uint8_t>(DeltaMode::kRaw))) {
    return absl::InvalidArgumentError(absl::StrCat("delta block mode ", int{mode_byte}, " is unknown"));
  }
  const auto out_of_order = [&](int64_t k) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta index ", k, " is out of order or past a ", words, "-word block"));
  };
  switch (static_cast<DeltaMode>(mode)) {
    case DeltaMode::kUnchanged:
      block.mode = DeltaMode::kUnchanged;
      return absl::OkStatus();
    case DeltaMode::kRaw:
      if (auto s = need(block_bytes); !s.ok()) return s;
      block.mode = DeltaMode::kRaw;
      block.values = encoded + at;
      at += block_bytes;
      return absl::OkStatus();
    case DeltaMode::kBitmask: {
      const int64_t mask_bytes = (words + 7) / 8;
      if (auto s = need(mask_bytes); !s.ok()) return s;
      const uint8_t* mask = encoded + at;
      for (int64_t b = 0; b < mask_bytes; ++b) block.count += __builtin_popcount(mask[b]);
      if (words % 8 != 0 && (mask[mask_bytes - 1] >> (words % 8)) != 0) {
        return absl::InvalidArgumentError(absl::StrCat("delta bitmask marks words past a ", words, "-word block"));
      }
      last_changed = (mask[(words - 1) / 8] >> ((words - 1) % 8)) & 1;
      block.mode = DeltaMode::kBitmask;
      block.where = mask;
      at += mask_bytes;
      break;
    }
    case DeltaMode::kIndices: {
      if (auto s = need(2); !s.ok()) return s;
      block.count = ReadUint16(encoded + at);
      at += 2;
      if (auto s = need(2 * block.count); !s.ok()) return s;
      int64_t previous = -1;
      for (int64_t i = 0; i < block.count; ++i) {
        const int64_t k = ReadUint16(encoded + at + 2 * i);
        if (k >= words || k <= previous) return out_of_order(k);
        previous = k;
      }
      last_changed = previous == words - 1;
      block.mode = DeltaMode::kIndices;
      block.where = encoded + at;
      at += 2 * block.count;
      break;
    }
    case DeltaMode::kGaps: {
      if (auto s = need(2); !s.ok()) return s;
      block.count = ReadUint16(encoded + at);
      at += 2;
      block.where = encoded + at;
      int64_t previous = -1;
      for (int64_t i = 0; i < block.count; ++i) {
        if (auto s = need(1); !s.ok()) return s;
        int64_t gap = encoded[at++];
        if (gap == kGapEscape) {
          if (auto s = need(2); !s.ok()) return s;
          gap = ReadUint16(encoded + at);
          at += 2;
        }
        const int64_t k = previous + 1 + gap;
        if (k >= words) return out_of_order(k);
        previous = k;
      }
      last_changed = previous == words - 1;
      block.mode = DeltaMode::kGaps;
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("delta block mode ", int{mode_byte}, " is unknown"));
  }
  const int64_t value_bytes = block.low_bytes ? block.count : kWordBytes * block.count - (odd && last_changed ? 1 : 0);
  if (auto s = need(value_bytes); !s.ok()) return s;
  block.values = encoded + at;
  at += value_bytes;
  return absl::OkStatus();
}

// Writes a read block into `data` (the block's start).
void WriteBlock(const BlockChanges& block, uint8_t* data, int64_t block_bytes) {
  const uint8_t* value = block.values;
  const auto write = [&](int64_t k) {
    uint8_t* word = data + k * kWordBytes;
    if (!block.low_bytes && WordLength(k, block_bytes) == kWordBytes) {
      std::memcpy(word, value, kWordBytes);  // a fixed size: no call
      value += kWordBytes;
    } else {
      *word = *value++;  // a first byte, or the odd last byte
    }
  };
  switch (block.mode) {
    case DeltaMode::kUnchanged:
      return;
    case DeltaMode::kRaw:
      std::memcpy(data, block.values, block_bytes);
      return;
    case DeltaMode::kBitmask: {
      const int64_t words = WordsOf(block_bytes);
      for (int64_t b = 0; b < (words + 7) / 8; ++b) {
        for (uint32_t bits = block.where[b]; bits != 0; bits &= bits - 1) write(8 * b + __builtin_ctz(bits));
      }
      return;
    }
    case DeltaMode::kIndices:
      for (int64_t i = 0; i < block.count; ++i) write(ReadUint16(block.where + 2 * i));
      return;
    case DeltaMode::kGaps: {
      const uint8_t* gaps = block.where;
      for (int64_t i = 0, previous = -1; i < block.count; ++i) {
        int64_t gap = *gaps++;
        if (gap == kGapEscape) {
          gap = ReadUint16(gaps);
          gaps += 2;
        }
        previous += 1 + gap;
        write(previous);
      }
      return;
    }
  }
}

}  // namespace

absl::Status ApplyDelta(const uint8_t* encoded, int64_t encoded_bytes, uint8_t* data, int64_t bytes) {
  // Checked whole before the first write: a refused encoding leaves `data` as it was.
  BlockChanges block;
  int64_t at = 0;
  for (int64_t start = 0; start < bytes; start += kDeltaBlockBytes) {
    if (auto s = ReadBlock(encoded, encoded_bytes, at, std::min(kDeltaBlockBytes, bytes - start), block); !s.ok()) {
      return s;
    }
  }
  if (at != encoded_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta encoding of ", bytes, " bytes has ", encoded_bytes - at, " bytes past its end"));
  }
  at = 0;
  for (int64_t start = 0; start < bytes; start += kDeltaBlockBytes) {
    const int64_t block_bytes = std::min(kDeltaBlockBytes, bytes - start);
    (void)ReadBlock(encoded, encoded_bytes, at, block_bytes, block);  // checked above
    WriteBlock(block, data + start, block_bytes);
  }
  return absl::OkStatus();
}

}  // namespace shardsync::executor

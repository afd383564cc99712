// The delta codec over what a peer may send (executor/delta_codec.h: a Transfer with
// `delta` set is applied onto the receiver's baseline). An input is a length (2 bytes),
// a seed (1 byte) and the rest R, used twice:
//  - R as an encoding applied onto a baseline of that length, in a buffer of exactly
//    that length: refused with the buffer untouched, or applied inside it (the
//    sanitizers bound every access);
//  - R as edits of that baseline (3 bytes each: a position and a byte): the encoding
//    EncodeDelta makes of the edited bytes applies back onto the baseline to them, bit
//    for bit, counts the changed words right and is at most raw plus a byte a block.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "executor/delta_codec.h"

namespace {

using shardsync::executor::ApplyDelta;
using shardsync::executor::DeltaCounts;
using shardsync::executor::EncodeDelta;
using shardsync::executor::kDeltaBlockBytes;

void Require(bool holds, const char* what) {
  if (!holds) {
    std::fprintf(stderr, "delta codec: %s\n", what);
    std::abort();
  }
}

// `bytes` of pseudo-random data from `seed` (splitmix64), in a heap buffer of exactly
// that size, so that a write past it is caught.
std::unique_ptr<uint8_t[]> Baseline(size_t bytes, uint64_t seed) {
  std::unique_ptr<uint8_t[]> out(new uint8_t[bytes]);
  uint64_t state = seed;
  for (size_t k = 0; k < bytes; ++k) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    out[k] = static_cast<uint8_t>(z ^ (z >> 31));
  }
  return out;
}

std::unique_ptr<uint8_t[]> Copy(const uint8_t* from, size_t bytes) {
  std::unique_ptr<uint8_t[]> out(new uint8_t[bytes]);
  if (bytes > 0) std::memcpy(out.get(), from, bytes);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  // Up to three blocks and a short one, odd lengths included.
  const size_t bytes = static_cast<size_t>(data[0] | data[1] << 8) % (3 * kDeltaBlockBytes + 8);
  const std::unique_ptr<uint8_t[]> baseline = Baseline(bytes, data[2]);
  const uint8_t* rest = data + 3;
  const size_t rest_size = size - 3;

  const std::unique_ptr<uint8_t[]> target = Copy(baseline.get(), bytes);
  if (!ApplyDelta(rest, static_cast<int64_t>(rest_size), target.get(), static_cast<int64_t>(bytes)).ok()) {
    Require(bytes == 0 || std::memcmp(target.get(), baseline.get(), bytes) == 0, "a refused encoding wrote");
  }

  if (bytes == 0) return 0;
  const std::unique_ptr<uint8_t[]> current = Copy(baseline.get(), bytes);
  for (size_t k = 0; k + 3 <= rest_size; k += 3)
    current[static_cast<size_t>(rest[k] | rest[k + 1] << 8) % bytes] = rest[k + 2];
  std::string encoded;
  const DeltaCounts counts = EncodeDelta(current.get(), baseline.get(), static_cast<int64_t>(bytes), encoded);
  const size_t blocks = (bytes + kDeltaBlockBytes - 1) / kDeltaBlockBytes;
  Require(counts.encoded_bytes == static_cast<int64_t>(encoded.size()), "the counts miss encoded bytes");
  Require(encoded.size() <= bytes + blocks, "the encoding is larger than raw and a byte a block");
  int64_t changed = 0;
  for (size_t k = 0; k < bytes; k += 2) changed += std::memcmp(&current[k], &baseline[k], k + 1 < bytes ? 2 : 1) != 0;
  Require(counts.changed_words == changed, "the changed words are miscounted");
  const std::unique_ptr<uint8_t[]> applied = Copy(baseline.get(), bytes);
  Require(ApplyDelta(reinterpret_cast<const uint8_t*>(encoded.data()), static_cast<int64_t>(encoded.size()),
                     applied.get(), static_cast<int64_t>(bytes))
              .ok(),
          "an encoding EncodeDelta made was refused");
  Require(std::memcmp(applied.get(), current.get(), bytes) == 0, "the applied encoding differs from the current bytes");
  return 0;
}

// The hash `sync --verify` compares, the same on the host and in CUDA code: a region of
// bytes hashes to the wrapping sum of WordHash(j, word j) over its 8-byte words (the
// last one zero-padded), so any split of the region into pieces that start at a word
// boundary gives the same sum, and a GPU block can hash its piece alone.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SHARDSYNC_HOST_DEVICE __host__ __device__
#else
#define SHARDSYNC_HOST_DEVICE
#endif

namespace shardsync::executor {

// splitmix64's finalizer: a bijection that spreads every input bit.
SHARDSYNC_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Word `index` of a region holding `word`: position and value both count. Each position
// has its own key (splitmix64's sequence, distinct for every index) and for a fixed
// index the hash is a bijection of the word, so one changed word always changes the
// sum. In a loop over indices the key is an addition: two multiplies a word.
SHARDSYNC_HOST_DEVICE inline uint64_t WordHash(uint64_t index, uint64_t word) {
  return Mix64(word ^ ((index + 1) * 0x9e3779b97f4a7c15ULL));
}

// A stretch of a region to hash: `bytes` at `data` (8-byte aligned, where the device
// reads: staging or a registered buffer), starting at word `first_word` of its region.
struct HashPiece {
  const uint8_t* data;
  int64_t bytes;
  int64_t first_word;
};

}  // namespace shardsync::executor

// Packs a rank's shards back to back in one buffer, each starting on a 256-byte
// boundary, as a rollout's weight arena holds them.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "planner/types.h"

namespace shardsync::planner {

inline constexpr int64_t kArenaAlignment = 256;  // bytes

class ArenaPacker {
 public:
  explicit ArenaPacker(int32_t buffer_id) : buffer_id_(buffer_id) {}

  // Reserves `elements` of `dtype` on `rank`; returns the offset in elements.
  int64_t Reserve(int32_t rank, int64_t elements, DType dtype);
  // Reserves `elements` at one offset valid on every rank of `ranks` (the first
  // aligned offset free on all of them), as a ZeRO flat needs.
  int64_t ReserveCommon(const std::vector<int32_t>& ranks, int64_t elements, DType dtype);
  // One buffer per rank that reserved anything, sized to its last reservation.
  std::vector<Buffer> Buffers() const;
  int32_t buffer_id() const { return buffer_id_; }

 private:
  int32_t buffer_id_;
  std::map<int32_t, int64_t> used_bytes_;
};

}  // namespace shardsync::planner

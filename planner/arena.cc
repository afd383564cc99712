#include "planner/arena.h"

#include <algorithm>

namespace shardsync::planner {

int64_t ArenaPacker::Reserve(int32_t rank, int64_t elements, DType dtype) {
  int64_t& used = used_bytes_[rank];
  const int64_t start = (used + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  used = start + elements * ElementBytes(dtype);
  return start / ElementBytes(dtype);
}

int64_t ArenaPacker::ReserveCommon(const std::vector<int32_t>& ranks, int64_t elements, DType dtype) {
  int64_t start = 0;
  for (int32_t rank : ranks) start = std::max(start, used_bytes_[rank]);
  start = (start + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  for (int32_t rank : ranks) used_bytes_[rank] = start + elements * ElementBytes(dtype);
  return start / ElementBytes(dtype);
}

std::vector<Buffer> ArenaPacker::Buffers() const {
  std::vector<Buffer> buffers;
  for (const auto& [rank, bytes] : used_bytes_) buffers.push_back(Buffer{Holder{rank, buffer_id_}, bytes, {}});
  return buffers;
}

}  // namespace shardsync::planner

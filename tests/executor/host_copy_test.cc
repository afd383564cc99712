#include "executor/host_copy.h"

#include <catch2/catch.hpp>
#include <cstring>

namespace shardsync::executor {
namespace {

TEST_CASE("float32 to bfloat16 rounds to nearest even and keeps NaN a NaN") {
  CHECK(Float32ToBFloat16(0x3f800000u) == 0x3f80);  // 1.0
  CHECK(Float32ToBFloat16(0x3f808000u) == 0x3f80);  // tie, even stays
  CHECK(Float32ToBFloat16(0x3f818000u) == 0x3f82);  // tie, odd rounds up
  CHECK(Float32ToBFloat16(0x3f80ffffu) == 0x3f81);
  CHECK((Float32ToBFloat16(0x7f800001u) & 0x7f80) == 0x7f80);
  CHECK((Float32ToBFloat16(0x7f800001u) & 0x007f) != 0);
}

TEST_CASE("pack then unpack of a strided 2-D piece lands every element, from any split point") {
  // Source: a [3, 5] window of a [4, 8] int32 matrix at row 1, col 2; target: contiguous.
  int32_t source[32], target[15];
  for (int i = 0; i < 32; ++i) source[i] = 100 + i;
  planner::Segment s;
  s.src_dtype = s.dst_dtype = planner::DType::kInt32;
  s.axes = 2;
  s.shape = {3, 5};
  s.src_base = 1 * 8 + 2;
  s.src_strides = {8, 1};
  s.dst_strides = {5, 1};
  for (int split = 0; split <= 15; ++split) {
    std::memset(target, 0, sizeof(target));
    uint8_t staging[60];
    PackHost(s, 0, split, reinterpret_cast<uint8_t*>(source), staging);
    UnpackHost(s, 0, split, staging, reinterpret_cast<uint8_t*>(target));
    PackHost(s, split, 15, reinterpret_cast<uint8_t*>(source), staging);
    UnpackHost(s, split, 15, staging, reinterpret_cast<uint8_t*>(target));
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 5; ++c) REQUIRE(target[r * 5 + c] == source[(1 + r) * 8 + 2 + c]);
    }
  }
  CHECK(IsContiguousRange(s, 5, 10, /*source=*/true));  // one source row
  CHECK_FALSE(IsContiguousRange(s, 4, 6, /*source=*/true));
}

}  // namespace
}  // namespace shardsync::executor

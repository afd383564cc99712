#include "executor/host_copy.h"

#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

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
  CHECK(IsContiguousRange(s, 0, 15, /*source=*/false));  // every target row, back to back
}

TEST_CASE("a range is contiguous exactly when each of its elements follows the one before") {
  // Every range of small 3-axis segments with packed, padded, unit and transposed
  // strides, against the elements' offsets computed one by one.
  const std::vector<std::array<int64_t, 3>> shapes = {{2, 3, 4}, {1, 3, 4}, {2, 1, 4}, {2, 3, 1}, {3, 1, 1}};
  int contiguous = 0, crossing_rows = 0;
  for (const auto& shape : shapes) {
    const int64_t packed[3] = {shape[1] * shape[2], shape[2], 1};
    const std::vector<std::array<int64_t, 3>> strides_tried = {{packed[0], packed[1], 1},
                                                               {packed[0] + 2, packed[1], 1},
                                                               {packed[0], packed[1] + 1, 1},
                                                               {1, shape[0], shape[0] * shape[1]},
                                                               {packed[0], packed[1], 2},
                                                               {7, packed[1], 1},
                                                               {packed[0], 9, 1}};
    for (const auto& strides : strides_tried) {
      planner::Segment s;
      s.axes = 3;
      for (int k = 0; k < 3; ++k) {
        s.shape[k] = shape[k];
        s.src_strides[k] = strides[k];
      }
      const int64_t n = shape[0] * shape[1] * shape[2];
      const auto offset = [&](int64_t e) {
        return (e / (shape[1] * shape[2])) * strides[0] + (e / shape[2] % shape[1]) * strides[1] +
               (e % shape[2]) * strides[2];
      };
      for (int64_t begin = 0; begin < n; ++begin) {
        for (int64_t end = begin + 1; end <= n; ++end) {
          bool follows = true;
          for (int64_t e = begin + 1; e < end; ++e) follows = follows && offset(e) == offset(e - 1) + 1;
          INFO("shape " << shape[0] << "x" << shape[1] << "x" << shape[2] << ", strides " << strides[0] << ","
                        << strides[1] << "," << strides[2] << ", [" << begin << ", " << end << ")");
          REQUIRE(IsContiguousRange(s, begin, end, /*source=*/true) == follows);
          contiguous += follows;
          crossing_rows += follows && begin / shape[2] != (end - 1) / shape[2];
        }
      }
    }
  }
  CHECK(crossing_rows > 50);  // not only ranges within one row
  CHECK(contiguous > crossing_rows);
}

}  // namespace
}  // namespace shardsync::executor

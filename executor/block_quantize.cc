#include "executor/block_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace shardsync::executor {

uint8_t Float32ToFloat8E4M3(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7f;              // NaN
  if (magnitude >= 0x43e00000u) return sign | 0x7e;             // >= 448: saturate
  if (magnitude < 0x3c800000u) {                                // below 2^-6: subnormal
    const float units = std::nearbyint(std::fabs(x) * 512.0f);  // of 2^-9, exact scaling
    return sign | static_cast<uint8_t>(units);                  // 8 units is 2^-6, encoded 0x08
  }
  // Rebias the exponent (127 -> 7) and round the 23-bit mantissa to 3 bits, ties to even;
  // a carry out of the mantissa moves into the exponent.
  const uint32_t rebiased = magnitude - ((127u - 7u) << 23);
  const uint32_t rounded = rebiased + 0x7ffffu + ((rebiased >> 20) & 1u);
  return sign | static_cast<uint8_t>(rounded >> 20);
}

float BlockScale(float amax) { return amax > 0 ? amax / planner::kFloat8E4M3Max : 1.0f; }

void QuantizeHost(const planner::QuantizeOp& op, const uint8_t* scratch, uint8_t* target, uint8_t* scale) {
  const auto input = [&](int64_t row, int64_t col) {
    uint16_t half;
    std::memcpy(&half, scratch + 2 * (op.scratch_base + row * op.cols + col), 2);
    const uint32_t bits = static_cast<uint32_t>(half) << 16;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  };
  for (int64_t block_row = 0; block_row * planner::kScaleBlock < op.rows; ++block_row) {
    for (int64_t block_col = 0; block_col * planner::kScaleBlock < op.cols; ++block_col) {
      const int64_t row0 = block_row * planner::kScaleBlock, col0 = block_col * planner::kScaleBlock;
      const int64_t row1 = std::min(op.rows, row0 + planner::kScaleBlock);
      const int64_t col1 = std::min(op.cols, col0 + planner::kScaleBlock);
      float amax = 0;
      for (int64_t r = row0; r < row1; ++r) {
        for (int64_t c = col0; c < col1; ++c) amax = std::max(amax, FiniteMagnitude(input(r, c)));
      }
      const float block_scale = BlockScale(amax);
      std::memcpy(scale + 4 * (op.scale_base + block_row * op.scale_row_stride + block_col), &block_scale, 4);
      for (int64_t r = row0; r < row1; ++r) {
        for (int64_t c = col0; c < col1; ++c) {
          target[op.target_base + r * op.target_row_stride + c] = Float32ToFloat8E4M3(input(r, c) / block_scale);
        }
      }
    }
  }
}

}  // namespace shardsync::executor

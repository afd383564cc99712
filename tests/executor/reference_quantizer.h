// Test oracle for block-quantized targets, written apart from the executor's
// quantizer: FLOAT8_E4M3 values decoded from their bit fields, the nearest one found by
// search, and the block rule (amax of the finite magnitudes / 448, 1 for an all-zero
// block, round to nearest even, saturate; infinities saturate, NaN stays NaN).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace shardsync::testing {

// The value of a FLOAT8_E4M3 (fn) code: 4 exponent bits (bias 7), 3 mantissa bits,
// no infinities; 0x7f and 0xff are NaN.
inline float DecodeFloat8E4M3(uint8_t code) {
  const int exponent = (code >> 3) & 15, mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return NAN;
  const float magnitude =
      exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9) : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

// The code nearest to finite `x` by search over every non-negative finite code, a tie
// to the even code; beyond the largest (448) the largest.
inline uint8_t NearestFloat8E4M3(float x) {
  static const std::array<double, 0x7f> decoded = [] {
    std::array<double, 0x7f> values{};
    for (int code = 0; code <= 0x7e; ++code) values[code] = DecodeFloat8E4M3(static_cast<uint8_t>(code));
    return values;
  }();
  const double magnitude = std::fabs(x);
  int best = 0;
  for (int code = 1; code <= 0x7e; ++code) {
    const double d = std::fabs(decoded[code] - magnitude), best_d = std::fabs(decoded[best] - magnitude);
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  return static_cast<uint8_t>(std::signbit(x) ? best | 0x80 : best);
}

inline float BFloat16Value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

// The scale of a block whose largest finite magnitude is `amax`.
inline float ReferenceBlockScale(float amax) { return amax == 0 ? 1.0f : amax / 448.0f; }

// The code of `x` in a block of scale `scale`: an infinity is the largest finite code
// of its sign, NaN is NaN (0x7f with its sign).
inline uint8_t ReferenceFloat8(float x, float scale) {
  if (std::isnan(x)) return std::signbit(x) ? 0xff : 0x7f;
  if (std::isinf(x)) return std::signbit(x) ? 0xfe : 0x7e;
  return NearestFloat8E4M3(x / scale);
}

}  // namespace shardsync::testing

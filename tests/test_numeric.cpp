// Scalar conversions (core/numeric.h) and the decode tables built on them, checked exhaustively
// where the code space is small and against independent references where it is not: g++'s
// _Float16 for fp16, a double-precision nearest-value search for bf16, e4m3 and e2m1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/formats/codec.h"
#include "core/numeric.h"
#include "test_util.h"

namespace qmoe {
namespace {

using num::bits_f32;
using num::f32_bits;

uint16_t half_bits(_Float16 h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
_Float16 half_from_bits(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return h;
}
bool f16_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }

// Random floats: uniform bit patterns (every exponent) plus uniform values in [-r, r].
std::vector<float> float_sweep(uint64_t seed, size_t count, float r) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-r, r);
  std::vector<float> v;
  v.reserve(2 * count);
  for (size_t i = 0; i < count; ++i) {
    v.push_back(bits_f32(static_cast<uint32_t>(rng())));
    v.push_back(uni(rng));
  }
  return v;
}

// Every value within `ulps` float ulps of x (both signs).
void push_neighbours(float x, int ulps, std::vector<float>* v) {
  const uint32_t u = f32_bits(std::fabs(x));
  for (int d = -ulps; d <= ulps; ++d) {
    const int64_t w = static_cast<int64_t>(u) + d;
    if (w < 0 || w > 0x7F800000) continue;
    v->push_back(bits_f32(static_cast<uint32_t>(w)));
    v->push_back(-bits_f32(static_cast<uint32_t>(w)));
  }
}

// ---- fp16 ----

TEST(Fp16, EveryCodeDecodesLikeFloat16AndRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t code = static_cast<uint16_t>(h);
    const float f = num::f16_to_f32(code);
    const float ref = static_cast<float>(half_from_bits(code));
    if (f16_is_nan(code)) {
      ASSERT_TRUE(std::isnan(f)) << h;
      ASSERT_EQ(f32_bits(f) >> 31, h >> 15) << h;
      ASSERT_TRUE(f16_is_nan(num::f32_to_f16(f))) << h;
      continue;
    }
    ASSERT_EQ(f32_bits(f), f32_bits(ref)) << "code " << h;
    ASSERT_EQ(num::f32_to_f16(f), code) << "code " << h;
  }
}

TEST(Fp16, RoundingMatchesFloat16) {
  std::vector<float> xs = float_sweep(test::fresh_seed(), 1 << 20, 70000.0f);
  // Edges: every midpoint between adjacent fp16 values (the ties), a few ulps around each, and the
  // overflow / underflow thresholds.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double a = num::f16_to_f32(static_cast<uint16_t>(h));
    const double b = h + 1 < 0x7C00 ? num::f16_to_f32(static_cast<uint16_t>(h + 1)) : 65536.0;
    push_neighbours(static_cast<float>((a + b) / 2), 2, &xs);  // midpoints are exact in fp32
    push_neighbours(static_cast<float>(a), 1, &xs);
  }
  for (float e : {65504.0f, 65519.99f, 65520.0f, 65536.0f, 5.9604645e-8f, 2.9802322e-8f,
                  6.1035156e-5f, 1e-30f, 3.4e38f}) {
    push_neighbours(e, 4, &xs);
  }
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  for (float x : xs) {
    const uint16_t got = num::f32_to_f16(x);
    const uint16_t want = half_bits(static_cast<_Float16>(x));
    if (std::isnan(x)) {
      ASSERT_TRUE(f16_is_nan(got)) << x;
      ASSERT_EQ(got >> 15, want >> 15);
      continue;
    }
    ASSERT_EQ(got, want) << "x = " << x << " (bits " << std::hex << f32_bits(x) << ")";
  }
}

// ---- bf16 ----

// Nearest bf16 by comparing distances in double, ties to the even code; beyond the largest finite
// value the next candidate is 2^128 (infinity).
uint16_t reference_bf16(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7FFFFFFFu;
  if (au >= 0x7F800000u) return static_cast<uint16_t>(u >> 16);  // inf (nan handled by caller)
  const uint32_t lo = au & 0xFFFF0000u;
  const uint32_t hi = lo + 0x10000u;
  const double a = std::fabs(static_cast<double>(x));
  const double lo_v = bits_f32(lo);
  const double hi_v = hi == 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(bits_f32(hi));
  uint32_t pick;
  if (a - lo_v < hi_v - a) {
    pick = lo;
  } else if (a - lo_v > hi_v - a) {
    pick = hi;
  } else {
    pick = ((lo >> 16) & 1u) ? hi : lo;
  }
  return static_cast<uint16_t>(sign | (pick >> 16));
}

TEST(Bf16, EveryCodeRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t code = static_cast<uint16_t>(b);
    const float f = num::bf16_to_f32(code);
    ASSERT_EQ(f32_bits(f), b << 16);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(num::bf16_to_f32(num::f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(num::f32_to_bf16(f), code) << b;
  }
}

TEST(Bf16, RoundingMatchesDoubleReference) {
  std::vector<float> xs = float_sweep(test::fresh_seed(), 1 << 20, 1e6f);
  std::mt19937_64 rng(test::fresh_seed());
  for (int i = 0; i < 100000; ++i) {  // exact ties and their neighbours at every exponent
    const uint32_t tie = (static_cast<uint32_t>(rng()) & 0x7FFF0000u) | 0x8000u;
    if (tie >= 0x7F800000u) continue;
    push_neighbours(bits_f32(tie), 1, &xs);
  }
  push_neighbours(bits_f32(0x7F7F8000u), 2, &xs);  // the overflow tie above the largest finite
  push_neighbours(bits_f32(0x00008000u), 2, &xs);  // subnormal ties
  for (float x : xs) {
    const uint16_t got = num::f32_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(num::bf16_to_f32(got)));
      continue;
    }
    ASSERT_EQ(got, reference_bf16(x)) << "bits " << std::hex << f32_bits(x);
  }
}

// ---- e4m3 ----

double reference_e4m3_value(int c) {
  const int exp = (c >> 3) & 15, man = c & 7;
  const double mag = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return (c & 0x80) ? -mag : mag;
}

// Nearest finite e4m3 (saturating at 448), ties to the even code, keeping the sign.
uint8_t reference_e4m3(float x) {
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  // Far above 448 the distances below are equal after rounding; saturation is the answer there.
  if (a >= 448.0) return static_cast<uint8_t>(0x7E | (std::signbit(x) ? 0x80 : 0));
  for (int c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(a - reference_e4m3_value(c));
    const double db = std::fabs(a - reference_e4m3_value(best));
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(E4m3, EveryCodeDecodesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float f = num::e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      ASSERT_TRUE(std::isnan(f)) << c;
      ASSERT_EQ(num::f32_to_e4m3(f), 0x7F);
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), reference_e4m3_value(c)) << c;
    ASSERT_EQ(std::signbit(f), (c & 0x80) != 0) << c;
    ASSERT_EQ(num::f32_to_e4m3(f), c) << c;
  }
}

TEST(E4m3, RoundingMatchesNearestOf256) {
  std::vector<float> xs = float_sweep(test::fresh_seed(), 1 << 14, 500.0f);
  for (int c = 0; c < 0x7E; ++c) {  // every midpoint (a tie) and its neighbours
    const double mid = (reference_e4m3_value(c) + reference_e4m3_value(c + 1)) / 2;
    push_neighbours(static_cast<float>(mid), 3, &xs);
    push_neighbours(static_cast<float>(reference_e4m3_value(c)), 2, &xs);
  }
  for (float e : {448.0f, 460.0f, 464.0f, 480.0f, 1e6f, 3.4e38f, 1e-30f})
    push_neighbours(e, 3, &xs);
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  std::mt19937_64 rng(test::fresh_seed());
  std::uniform_real_distribution<float> tiny(-0.03f, 0.03f);  // the subnormal range
  for (int i = 0; i < 20000; ++i) xs.push_back(tiny(rng));
  for (float x : xs) {
    if (std::isnan(x)) {
      ASSERT_EQ(num::f32_to_e4m3(x), 0x7F);
      continue;
    }
    ASSERT_EQ(num::f32_to_e4m3(x), reference_e4m3(x)) << "x = " << x;
  }
}

// ---- e2m1 ----

const double kE2m1Mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

uint8_t reference_e2m1(float x) {
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  if (a >= 6.0) return static_cast<uint8_t>(7 | (std::signbit(x) ? 8 : 0));  // saturation
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kE2m1Mag[c]), db = std::fabs(a - kE2m1Mag[best]);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 8 : 0));
}

TEST(E2m1, EveryCodeDecodesAndRoundTrips) {
  for (int c = 0; c < 16; ++c) {
    const float f = num::e2m1_to_f32(static_cast<uint8_t>(c));
    ASSERT_EQ(static_cast<double>(std::fabs(f)), kE2m1Mag[c & 7]) << c;
    ASSERT_EQ(std::signbit(f), (c & 8) != 0) << c;
    ASSERT_EQ(num::f32_to_e2m1(f), c) << c;
  }
}

TEST(E2m1, RoundingMatchesNearestOf16) {
  std::vector<float> xs = float_sweep(test::fresh_seed(), 1 << 14, 8.0f);
  for (int c = 0; c < 7; ++c) {
    push_neighbours(static_cast<float>((kE2m1Mag[c] + kE2m1Mag[c + 1]) / 2), 3, &xs);
    push_neighbours(static_cast<float>(kE2m1Mag[c]), 2, &xs);
  }
  push_neighbours(6.0f, 3, &xs);
  push_neighbours(1e30f, 1, &xs);
  xs.push_back(std::numeric_limits<float>::infinity());
  for (float x : xs) {
    if (std::isnan(x)) continue;  // documented as not representable
    ASSERT_EQ(num::f32_to_e2m1(x), reference_e2m1(x)) << "x = " << x;
  }
}

// ---- e8m0 ----

TEST(E8m0, EveryCodeIsAPowerOfTwo) {
  for (int c = 0; c < 256; ++c) {
    const float f = num::e8m0_to_f32(static_cast<uint8_t>(c));
    if (c == 255) {
      ASSERT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), std::ldexp(1.0, c - 127)) << c;
  }
}

// ---- the decode tables of the format codecs ----

TEST(DecodeTables, E4m3TableEqualsScalarDecodeBitwise) {
  for (int c = 0; c < 256; ++c) {
    ASSERT_EQ(f32_bits(formats::kE4m3.v[c]), f32_bits(num::e4m3_to_f32(static_cast<uint8_t>(c))))
        << c;
  }
}

TEST(DecodeTables, E2m1PairsEqualScalarDecodeBitwise) {
  for (int b = 0; b < 256; ++b) {
    ASSERT_EQ(f32_bits(formats::kE2m1Pairs.v[b][0]),
              f32_bits(num::e2m1_to_f32(static_cast<uint8_t>(b & 15))));
    ASSERT_EQ(f32_bits(formats::kE2m1Pairs.v[b][1]),
              f32_bits(num::e2m1_to_f32(static_cast<uint8_t>(b >> 4))));
  }
}

TEST(DecodeTables, BitstreamReadWriteRoundTrip) {
  std::mt19937_64 rng(test::fresh_seed());
  for (int bits : {2, 3, 4, 8}) {
    const int count = 37;
    std::vector<unsigned> codes(count);
    std::vector<uint8_t> stream(static_cast<size_t>(formats::packed_bytes(count, bits)), 0);
    for (int i = 0; i < count; ++i) {
      codes[i] = static_cast<unsigned>(rng()) & ((1u << bits) - 1u);
      formats::write_bits(stream.data(), i, bits, codes[i]);
    }
    for (int i = 0; i < count; ++i) {
      // Stream bit j is bit j % 8 of byte j / 8.
      unsigned want = 0;
      for (int t = 0; t < bits; ++t) {
        const int j = i * bits + t;
        want |= ((stream[j / 8] >> (j % 8)) & 1u) << t;
      }
      ASSERT_EQ(want, codes[i]) << bits << " bits, code " << i;
      ASSERT_EQ(formats::read_bits(stream.data(), i, bits), codes[i]);
    }
    const int used = count * bits;  // padding bits stay zero
    for (int j = used; j < static_cast<int>(stream.size()) * 8; ++j) {
      ASSERT_EQ((stream[j / 8] >> (j % 8)) & 1u, 0u);
    }
  }
}

}  // namespace
}  // namespace qmoe

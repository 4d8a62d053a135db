// MXFP4's e4m3 copy (core/formats/fp4_e4m3.h): every chunk the function calls exact decodes, as
// e4m3(v) * s in fp32, to bitwise the dequantize path's weight (e2m1 * 2^(c - 127)) * g, and the
// function's verdict equals the rule its header states, checked from the rule's own terms (the
// codes' block spreads, nan scales, s's exponent) over every code and spread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/formats/fp4_e4m3.h"
#include "core/numeric.h"

namespace qmoe {
namespace {

uint32_t bits(float f) { return num::f32_bits(f); }

// The rule of fp4_e4m3.h, from its terms: no scale code above 252 (nan, or the dequantize path's
// overflow before g), every nonzero code within 14 binades of the chunk's largest block in K, and
// s = g * 2^(cmax - 133) normal (or g zero).
bool rule_says_exact(const uint8_t* codes, const std::vector<int>& c, float g) {
  const int cmax = *std::max_element(c.begin(), c.end());
  if (cmax > 252) return false;
  for (size_t i = 0; i < 32 * c.size(); ++i) {
    const int q = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
    if ((q & 7) != 0 && cmax - c[i / 32] > 14) return false;
  }
  if (g == 0.0f) return true;
  const double s = static_cast<double>(g) * std::ldexp(1.0, cmax - 133);
  return std::fabs(s) >= std::ldexp(1.0, -126) && std::fabs(s) < std::ldexp(1.0, 128);
}

// Checks one chunk of kChunk codes whose first 32 c.size() lie in K: the verdict against the
// rule and, where exact, every weight bitwise and the codes past K zero.
template <int kChunk>
void check_chunk_of(const uint8_t* codes, const std::vector<int>& c, float g) {
  std::string trace = "chunk " + std::to_string(kChunk) + " g " + std::to_string(g) + " blocks";
  for (int x : c) trace += " " + std::to_string(x);
  SCOPED_TRACE(trace);
  std::vector<uint8_t> e8m0(c.begin(), c.end());
  uint8_t out[kChunk];
  float s = 0.0f;
  const int valid = static_cast<int>(32 * c.size());
  const bool exact = formats::mxfp4_chunk_to_e4m3<kChunk>(codes, e8m0.data(), valid, g, out, &s);
  ASSERT_EQ(exact, rule_says_exact(codes, c, g));
  if (!exact) return;
  for (int i = 0; i < valid; ++i) {
    const uint8_t q = (codes[i / 2] >> (4 * (i % 2))) & 0xF;
    const volatile float block = num::e2m1_to_f32(q) * num::e8m0_to_f32(e8m0[i / 32]);
    const float want = block * g;  // the dequantize path: the exact block product, then g
    const float got = num::e4m3_to_f32(out[i]) * s;
    ASSERT_EQ(bits(got), bits(want)) << "element " << i << " code " << int(q);
  }
  for (int i = valid; i < kChunk; ++i) ASSERT_EQ(out[i], 0) << "past K, element " << i;
}

void check_chunk(const uint8_t* codes, int c0, int c1, float g) {
  check_chunk_of<64>(codes, {c0, c1}, g);
}

TEST(Fp4E4m3, EverySpreadAndCode) {
  std::mt19937 rng(1234);
  std::vector<uint8_t> codes(32);
  const float gs[] = {1.0f, -0.75f, 3.0e-3f, 0.0f, 1.0e-30f, 6.0e20f};
  for (int c1 = 100; c1 <= 140; c1 += 1) {
    for (float g : gs) {
      for (int trial = 0; trial < 4; ++trial) {
        for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
        check_chunk(codes.data(), 120, c1, g);
        check_chunk(codes.data(), c1, 120, g);
      }
    }
  }
}

// A block 15+ binades below its neighbour converts only where all its codes are zero (+-0).
TEST(Fp4E4m3, WideSpreadNeedsZeroCodes) {
  std::vector<uint8_t> codes(32, 0x00);
  for (int j = 16; j < 32; ++j) codes[j] = 0x7F;  // the second block: 6 and -6
  codes[3] = 0x80;                                // +0 and -0 in the first block
  check_chunk(codes.data(), 100, 130, 1.0f);      // spread 30, the low block all zero: exact
  uint8_t e8m0[2] = {100, 130}, out[64];
  float s;
  ASSERT_TRUE(formats::mxfp4_chunk_to_e4m3<64>(codes.data(), e8m0, 64, 1.0f, out, &s));
  EXPECT_EQ(out[7], 0x80) << "-0 keeps its sign";
  codes[5] = 0x01;  // 0.5 in the low block
  check_chunk(codes.data(), 100, 130, 1.0f);
  ASSERT_FALSE(formats::mxfp4_chunk_to_e4m3<64>(codes.data(), e8m0, 64, 1.0f, out, &s));
  check_chunk(codes.data(), 116, 130, 1.0f);  // spread 14: exact (0.5 becomes 2^-9)
  check_chunk(codes.data(), 115, 130, 1.0f);  // 15: not
}

// Scales at the ends of e8m0's range, nan codes, and global scales that push s out of fp32's
// normal range.
TEST(Fp4E4m3, ScaleEnds) {
  std::mt19937 rng(99);
  std::vector<uint8_t> codes(32);
  for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
  for (int c : {0, 1, 6, 7, 8, 13, 127, 200, 252, 253, 254, 255}) {
    for (float g : {1.0f, 0.5f, 4.0f, 1.0e-20f, 3.0e30f, 0.0f, -1.0f}) {
      check_chunk(codes.data(), c, c, g);
      check_chunk(codes.data(), c, std::max(0, c - 3), g);
    }
  }
}

// The FP8 GEMM's chunks of 128 (four blocks): random spreads, and chunks cut short by the end of
// K (one, two or three blocks in K, the rest zeros), which take cmax from their blocks in K only.
TEST(Fp4E4m3, RowsChunksAndShortChunks) {
  std::mt19937 rng(4321);
  std::vector<uint8_t> codes(64);
  for (int trial = 0; trial < 4000; ++trial) {
    for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
    const int blocks = 1 + static_cast<int>(rng() % 4);
    std::vector<int> c(static_cast<size_t>(blocks));
    for (int& x : c) x = 110 + static_cast<int>(rng() % 20);  // spreads up to 19 binades
    const float g = trial % 7 == 0 ? 0.0f : std::ldexp(1.0f + (rng() % 100) / 128.0f, -3);
    check_chunk_of<128>(codes.data(), c, g);
  }
  // A short chunk's missing blocks do not count: its one block at 100 converts though a block
  // at 130 would have refused it.
  std::fill(codes.begin(), codes.end(), 0x11);  // 0.5 everywhere
  check_chunk_of<128>(codes.data(), {100}, 1.0f);
  check_chunk_of<128>(codes.data(), {100, 130}, 1.0f);  // refused: 0.5 lies 30 binades down
}

}  // namespace
}  // namespace qmoe

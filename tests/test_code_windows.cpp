// The decode kernel's code windows (code_windows.h): for every width and activation type, every
// pair of a packed word, every pair of codes and every zero point, the word shifted and masked
// with its window's constants is exactly base + q in each half, and base + zp is exact too, so
// the kernel's subtraction gives exactly q - zp. The other bits of the word are random: a mask
// that let a neighbour's bit in would show.
#include <gtest/gtest.h>

#include <random>

#include "core/formats/code_windows.h"
#include "core/numeric.h"

namespace qmoe::test {
namespace {

template <int kBits, bool kBf16>
void check_windows() {
  using W = formats::CodeWindows<kBits, kBf16>;
  SCOPED_TRACE(std::to_string(kBits) + (kBf16 ? " bits, bf16" : " bits, f16"));
  auto to_float = [](uint16_t h) { return kBf16 ? num::bf16_to_f32(h) : num::f16_to_f32(h); };
  auto from_float = [](float f) { return kBf16 ? num::f32_to_bf16(f) : num::f32_to_f16(f); };
  std::mt19937 rng(1234 + kBits * 2 + (kBf16 ? 1 : 0));
  const uint32_t qmax = 1u << kBits;
  int shifts_needed = 0;
  for (int j = 0; j < W::kPairsPerWord; ++j) {
    const int i = W::position_index(j);
    ASSERT_GE(i, 0);
    ASSERT_LT(i, W::kPositions);
    ASSERT_EQ(W::shift(j) + W::pos(j), kBits * j);
    ASSERT_LE(W::pos(j) + kBits, W::kMantissa) << "pair " << j << " leaves the mantissa";
    if (j > 0 && W::shift(j) != W::shift(j - 1)) ++shifts_needed;
    for (uint32_t lo = 0; lo < qmax; ++lo) {
      for (uint32_t hi = 0; hi < qmax; ++hi) {
        const uint32_t field = ((1u << kBits) - 1u) << (kBits * j);
        uint32_t v = rng() & ~(field | (field << 16));
        v |= lo << (kBits * j) | hi << (kBits * j + 16);
        const uint32_t q = ((v >> W::shift(j)) & W::mask(i)) | W::base_bits(i);
        const float vlo = to_float(static_cast<uint16_t>(q & 0xFFFFu));
        const float vhi = to_float(static_cast<uint16_t>(q >> 16));
        ASSERT_EQ(vlo, W::base(i) + static_cast<float>(lo)) << "pair " << j << " codes " << lo;
        ASSERT_EQ(vhi, W::base(i) + static_cast<float>(hi)) << "pair " << j << " codes " << hi;
        for (uint32_t zp = 0; zp < qmax; ++zp) {
          const float sub = W::base(i) + static_cast<float>(zp);
          ASSERT_EQ(to_float(from_float(sub)), sub) << "base + zp " << sub << " is not exact";
          const float d = to_float(from_float(vlo - sub));
          ASSERT_EQ(d, static_cast<float>(lo) - static_cast<float>(zp));
        }
      }
    }
  }
  // The point of the windows: fewer shifts than pairs.
  EXPECT_EQ(shifts_needed, (W::kPairsPerWord - 1) / W::kPositions);
}

TEST(CodeWindows, EveryPairDecodesExactly) {
  check_windows<2, true>();
  check_windows<2, false>();
  check_windows<3, true>();
  check_windows<3, false>();
  check_windows<4, true>();
  check_windows<4, false>();
  check_windows<8, false>();
}

TEST(CodeWindows, Int2Bf16NeedsTwoShiftsPerWord) {
  using W = formats::CodeWindows<2, true>;
  EXPECT_EQ(W::kPositions, 3);
  EXPECT_EQ(W::shift(0), 0);
  EXPECT_EQ(W::shift(2), 0);
  EXPECT_EQ(W::shift(3), 6);
  EXPECT_EQ(W::shift(6), 12);
  EXPECT_EQ(W::base_bits(0), 0x43004300u);  // 128
  EXPECT_EQ(W::base_bits(1), 0x42004200u);  // 32
  EXPECT_EQ(W::base_bits(2), 0x41004100u);  // 8
}

}  // namespace
}  // namespace qmoe::test

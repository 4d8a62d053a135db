// Where the decode kernel reads each code pair of a packed 32-bit word (mma_pack.h), so that one
// LOP3 turns it into an exact bf16x2/f16x2 value with as few shifts as possible.
//
// A word holds 16 / bits code pairs: pair j's two codes sit at bits [bits * j, bits * j + bits)
// of each 16-bit half. OR-ing the exponent of 2^(m - p) (m: the mantissa width, 7 for bf16, 10
// for f16) onto a code at bit p of the mantissa gives exactly 2^(m - p) + q, as long as the code
// stays inside the mantissa (p + bits <= m). So a window of positions 0, bits, 2 bits, ... is
// read from the unshifted word, each pair with its own base, and only the pairs beyond it need the
// word shifted (by a whole window). For int2 with bf16: pairs 0-2 at bits 0, 2, 4 (bases 128, 32,
// 8), pairs 3-5 after a shift by 6, pairs 6-7 after a shift by 12: two shifts for eight pairs,
// where one shift per pair was needed with base 128 alone. The value minus (base + zero point)
// is the exact q - zp, since both operands and the difference are small integers the type holds.
//
// The window holds at most kMaxPositions positions: each needs its own (base + zp) constant per
// row in the kernel's registers. One position is the plain form: a shift for every pair.
#pragma once

#include <cstdint>

#include "core/numeric.h"

namespace qmoe::formats {

template <int kBits, bool kBf16, int kMaxPos = 3>
struct CodeWindows {
  static_assert(kBits == 2 || kBits == 3 || kBits == 4 || (kBits == 8 && !kBf16),
                "int8 with bf16 does not fit the mantissa; it is converted through fp32");
  static_assert(kMaxPos >= 1, "a window holds at least one position");
  static constexpr int kMaxPositions = kMaxPos;
  static constexpr int kMantissa = kBf16 ? 7 : 10;
  static constexpr int kPairsPerWord = 16 / kBits;  // int3: 5, bit 15 unused
  // Positions per window: every p = bits * i with p + bits <= mantissa, at most kMaxPositions.
  static constexpr int kPositions =
      (kMantissa / kBits) < kMaxPositions ? (kMantissa / kBits) : kMaxPositions;
  static constexpr int kWindow = kPositions * kBits;  // bits a shift skips

  // Pair j of a word: shifted right by shift(j), its codes sit at bit pos(j) of each half.
  QMOE_HD static constexpr int shift(int j) { return (kBits * j) / kWindow * kWindow; }
  QMOE_HD static constexpr int position_index(int j) { return (kBits * j - shift(j)) / kBits; }
  QMOE_HD static constexpr int pos(int j) { return kBits * j - shift(j); }

  // The mask of a pair at position index i, in both halves.
  QMOE_HD static constexpr uint32_t mask(int i) {
    return ((1u << kBits) - 1u) << (kBits * i) | (((1u << kBits) - 1u) << (kBits * i + 16));
  }
  // The base 2^(m - p) of position index i: its float value and its bits, in both halves.
  QMOE_HD static constexpr float base(int i) {
    return static_cast<float>(1u << (kMantissa - kBits * i));
  }
  QMOE_HD static constexpr uint32_t base_bits(int i) {
    const uint32_t e = kBf16 ? static_cast<uint32_t>(127 + kMantissa - kBits * i) << 7
                             : static_cast<uint32_t>(15 + kMantissa - kBits * i) << 10;
    return e | (e << 16);
  }
};

}  // namespace qmoe::formats

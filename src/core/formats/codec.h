// Building blocks shared by the format codecs: LSB-first bitstreams, code tables and scale storage.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "core/numeric.h"
#include "qmoe/tensor.h"

namespace qmoe {
namespace formats {

QMOE_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of `count` codes of `bits` bits in an LSB-first bitstream.
QMOE_HD int64_t packed_bytes(int64_t count, int bits) { return ceil_div(count * bits, 8); }

// Code `idx` of an LSB-first bitstream: stream bit i is bit (i % 8) of byte i / 8, and code idx
// occupies stream bits [idx * bits, (idx + 1) * bits). bits <= 8, so a code spans at most 2 bytes;
// the second byte is touched only when the code reaches into it (never past the stream's end).
// Host and device share it (the CUDA backend's dequantization reads the same streams).
QMOE_HD unsigned read_bits(const uint8_t* p, int64_t idx, int bits) {
  const int64_t bit = idx * bits;
  const uint8_t* b = p + (bit >> 3);
  const int shift = static_cast<int>(bit & 7);
  unsigned v = static_cast<unsigned>(b[0]) >> shift;
  if (shift + bits > 8) v |= static_cast<unsigned>(b[1]) << (8 - shift);
  return v & ((1u << bits) - 1u);
}

// Codes k0..k0 + 3 of an LSB-first stream of `bits`-bit codes (4 bits <= 32 bits), reading only the
// bytes they occupy (at most 5). Host and device (the decode layout's packers on both sides).
QMOE_HD unsigned read_quad(const uint8_t* row, int64_t k0, int bits) {
  const int64_t bit = k0 * bits;
  const uint8_t* p = row + (bit >> 3);
  const int shift = static_cast<int>(bit & 7);
  const int bytes = (shift + 4 * bits + 7) / 8;
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<unsigned>((v >> shift) & ((uint64_t{1} << (4 * bits)) - 1));
}

// ORs code `v` (< 2^bits) into a stream whose bits for idx are still zero.
inline void write_bits(uint8_t* p, int64_t idx, int bits, unsigned v) {
  const int64_t bit = idx * bits;
  uint8_t* b = p + (bit >> 3);
  const int shift = static_cast<int>(bit & 7);
  b[0] = static_cast<uint8_t>(b[0] | (v << shift));
  if (shift + bits > 8) b[1] = static_cast<uint8_t>(b[1] | (v >> (8 - shift)));
}

// The 256 e4m3fn values by code, equal bit for bit to num::e4m3_to_f32: dequantization loops over
// codes and block scales load from it instead of running a branchy decode per element.
struct E4m3Table {
  float v[256];
};
constexpr E4m3Table make_e4m3_table() {
  E4m3Table t{};
  for (int c = 0; c < 128; ++c) {
    const int exp = c >> 3, man = c & 7;
    float v = 0.0f;
    if (c == 0x7F) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      v = static_cast<float>(man) * 0.001953125f;  // man * 2^-9
    } else {
      v = static_cast<float>(8 + man) * 0.125f;  // (1 + man / 8) * 2^(exp - 7), exact
      for (int i = exp; i < 7; ++i) v *= 0.5f;
      for (int i = 7; i < exp; ++i) v *= 2.0f;
    }
    t.v[c] = v;
    t.v[c | 0x80] = -v;
  }
  return t;
}
inline constexpr E4m3Table kE4m3 = make_e4m3_table();

// The two E2M1 values of every byte (low nibble first), equal to num::e2m1_to_f32. One 8-byte
// load and store per byte decodes about twice as fast as a 16-entry table or bit assembly.
struct E2m1Pairs {
  float v[256][2];
};
constexpr E2m1Pairs make_e2m1_pairs() {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  E2m1Pairs t{};
  for (int b = 0; b < 256; ++b) {
    for (int h = 0; h < 2; ++h) {
      const int c = (b >> (4 * h)) & 15;
      t.v[b][h] = (c & 8) ? -kMag[c & 7] : kMag[c & 7];
    }
  }
  return t;
}
inline constexpr E2m1Pairs kE2m1Pairs = make_e2m1_pairs();

// Scale element i of a scale tensor of dtype kT, decoded to fp32 (exact for every dtype).
template <DType kT>
inline float load_scale(const uint8_t* p, int64_t i);
template <>
inline float load_scale<DType::kF32>(const uint8_t* p, int64_t i) {
  float f;
  std::memcpy(&f, p + 4 * i, 4);
  return f;
}
template <>
inline float load_scale<DType::kF16>(const uint8_t* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return num::f16_to_f32(h);
}
template <>
inline float load_scale<DType::kBF16>(const uint8_t* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return num::bf16_to_f32(h);
}
template <>
inline float load_scale<DType::kF8E4M3>(const uint8_t* p, int64_t i) {
  return kE4m3.v[p[i]];
}
template <>
inline float load_scale<DType::kF8E8M0>(const uint8_t* p, int64_t i) {
  return num::e8m0_to_f32(p[i]);
}

// Rounds a finite, non-negative scale to f32/f16/bf16 (nearest even), stores it as element i and
// returns the stored value. A scale beyond the dtype's range saturates to its largest finite value:
// dequantized weights then clip instead of becoming inf or NaN.
inline float store_float_scale(DType t, float s, uint8_t* p, int64_t i) {
  switch (t) {
    case DType::kF16: {
      uint16_t h = num::f32_to_f16(s);
      if ((h & 0x7FFFu) == 0x7C00u) h = static_cast<uint16_t>((h & 0x8000u) | 0x7BFFu);
      std::memcpy(p + 2 * i, &h, 2);
      return num::f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h = num::f32_to_bf16(s);
      if ((h & 0x7FFFu) == 0x7F80u) h = static_cast<uint16_t>((h & 0x8000u) | 0x7F7Fu);
      std::memcpy(p + 2 * i, &h, 2);
      return num::bf16_to_f32(h);
    }
    default:
      std::memcpy(p + 4 * i, &s, 4);
      return s;
  }
}

}  // namespace formats
}  // namespace qmoe

// MXFP4 codes as e4m3 codes with a power-of-two scale per chunk of 64 along K, exactly: the copy
// through which the mixed-input GEMM (cutlass_mixed.h, kind kE4m3) runs MXFP4 FCs on the tensor
// cores without a dequantized copy. The host and the device call the same function.
//
// An MXFP4 weight is e2m1(q) * 2^(c - 127) * g: q a 4-bit code (at most two significant bits), c
// its 32-K block's e8m0 code, g the expert's fp32 global scale. The dequantize path (CPU and GPU)
// forms e2m1(q) * 2^(c - 127), exact in fp32, and rounds its product with g once. A chunk of 64
// codes (blocks c0, c1; cmax the larger) becomes
//
//   v = e2m1(q) * 2^(c - cmax + 6)    an e4m3 code
//   s = g * 2^(cmax - 133)            fp32, one per (row, chunk)
//
// so v * s is the same real number as e2m1(q) * 2^(c - 127) * g and rounds to the same fp32: the
// kernel's e4m3 -> f32, times s, gives bitwise the dequantize path's weight before the rounding
// to the activation dtype that both take.
//   v is exact where d = cmax - c <= 14 for each nonzero code: |e2m1| in {0.5, 1, 1.5, 2, 3, 4, 6}
//     times 2^(6 - d) is a multiple of 2^-9 (e4m3's least subnormal) from 2^-9 (0.5 at d = 14)
//     to 384 (6 at d = 0; e4m3 ends at 448). Real checkpoints' two neighbouring blocks differ by a
//     few binades.
//   s is exact where it is a normal fp32 (a power of two times g), or g is 0.
// A chunk where either fails, or with an e8m0 code above 252 (the dequantize path's e2m1 * 2^(c -
// 127) may overflow fp32 there before g applies, where v * s would not; 0xFF is nan), is
// refused: the function returns false and the layer keeps the dequantize path for that FC.
#pragma once

#include <cstdint>

#include "core/numeric.h"

namespace qmoe::formats {

// K codes per scale of the e4m3 copy: the mixed-input kernel's K tile, two of MXFP4's 32-K blocks.
constexpr int kFp4E4m3Chunk = 64;

// One chunk: codes = 32 K-packed bytes (low nibble = even k), e8m0 = its two block codes, g the
// expert's global scale; out = 64 e4m3 codes in K order, *scale = s. Returns whether the chunk is
// exact (out and *scale are written either way).
QMOE_HD bool mxfp4_chunk_to_e4m3(const uint8_t* codes, const uint8_t* e8m0, float g, uint8_t* out,
                                 float* scale) {
  const int c0 = e8m0[0], c1 = e8m0[1];
  const int cmax = c0 > c1 ? c0 : c1;
  bool exact = cmax <= 252;
  // 2^(cmax - 133): normal for cmax >= 7, else the subnormal 2^-149 * 2^(cmax + 16).
  const float p2 = cmax >= 7 ? num::bits_f32(static_cast<uint32_t>(cmax - 6) << 23)
                             : num::bits_f32(1u << (cmax + 16));
  const float s = g * p2;
  const uint32_t s_exp = (num::f32_bits(s) >> 23) & 0xFFu;
  exact = exact && (g == 0.0f || (s_exp != 0 && s_exp != 0xFF));
  *scale = s;
  for (int h = 0; h < 2; ++h) {
    const int d = cmax - (h == 0 ? c0 : c1);
    // 2^(6 - d), d clamped to 14 (a code past it must be zero, checked below).
    const int dc = d < 14 ? d : 14;
    const float shift = num::bits_f32(static_cast<uint32_t>(127 + 6 - dc) << 23);
    for (int j = 0; j < 16; ++j) {
      const uint8_t byte = codes[h * 16 + j];
      for (int nib = 0; nib < 2; ++nib) {
        const uint8_t q = nib == 0 ? (byte & 0xFu) : (byte >> 4);
        const float v = num::e2m1_to_f32(q) * shift;
        const uint8_t e = num::f32_to_e4m3(v);
        exact = exact && (d <= 14 || (q & 7u) == 0) &&
                num::f32_bits(num::e4m3_to_f32(e)) == num::f32_bits(v);
        out[h * 32 + 2 * j + nib] = e;
      }
    }
  }
  return exact;
}

}  // namespace qmoe::formats

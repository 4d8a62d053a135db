// MXFP4 codes as e4m3 codes with a power-of-two scale per chunk along K, exactly: the copies
// through which MXFP4 FCs run on the tensor cores without a dequantized copy. Two chunk widths:
// 64 (kFp4E4m3Chunk) for the mixed-input GEMM (cutlass_mixed.h, kind kE4m3: e4m3 converted to
// the activation dtype in registers) and 128 (kFp4E4m3RowsChunk) for the FP8 GEMM under FP8
// activations (cutlass_fp8.h: e4m3 x e4m3 with a scale per weight row and 128 columns). The host
// and the device call the same function.
//
// An MXFP4 weight is e2m1(q) * 2^(c - 127) * g: q a 4-bit code (at most two significant bits), c
// its 32-K block's e8m0 code, g the expert's fp32 global scale. The dequantize path (CPU and GPU)
// forms e2m1(q) * 2^(c - 127), exact in fp32, and rounds its product with g once. A chunk of
// blocks c_0 .. c_{b-1} (cmax the largest) becomes
//
//   v = e2m1(q) * 2^(c - cmax + 6)    an e4m3 code
//   s = g * 2^(cmax - 133)            fp32, one per (row, chunk)
//
// so v * s is the same real number as e2m1(q) * 2^(c - 127) * g and rounds to the same fp32: the
// kernel's e4m3 -> f32, times s, gives bitwise the dequantize path's weight before the rounding
// to the activation dtype that both take (the FP8 GEMM multiplies v by the activation's code
// first and applies s to the block's sum: the weight's value is the same real number).
//   v is exact where d = cmax - c <= 14 for each nonzero code: |e2m1| in {0.5, 1, 1.5, 2, 3, 4, 6}
//     times 2^(6 - d) is a multiple of 2^-9 (e4m3's least subnormal) from 2^-9 (0.5 at d = 14)
//     to 384 (6 at d = 0; e4m3 ends at 448). Real checkpoints' neighbouring blocks differ by a
//     few binades.
//   s is exact where it is a normal fp32 (a power of two times g), or g is 0.
// A chunk where either fails, or with an e8m0 code above 252 (the dequantize path's e2m1 * 2^(c -
// 127) may overflow fp32 there before g applies, where v * s would not; 0xFF is nan), is
// refused: the function returns false and the layer keeps the dequantize path for that FC (the
// mixed-input copy) or refuses FP8 activations (the FP8 copy).
//
// A chunk may be cut short by the end of K (k a multiple of 32 but not of the chunk: gpt-oss's
// 2880 = 22.5 x 128): its codes past K are zeros and only its blocks in K count for cmax.
#pragma once

#include <cstdint>

#include "core/numeric.h"

namespace qmoe::formats {

// K codes per scale of the mixed-input GEMM's e4m3 copy: its K tile, two of MXFP4's 32-K blocks.
constexpr int kFp4E4m3Chunk = 64;
// K codes per scale of the FP8 GEMM's copy: its K scale block (cutlass_fp8.h), four blocks.
constexpr int kFp4E4m3RowsChunk = 128;

// One chunk of kChunk codes of which the first `valid` (a multiple of 32, at most kChunk) lie in
// K: codes = valid / 2 K-packed bytes (low nibble = even k), e8m0 = its valid / 32 block codes,
// g the expert's global scale; out = kChunk e4m3 codes in K order (zeros past valid), *scale =
// s. Returns whether the chunk is exact (out and *scale are written either way).
template <int kChunk>
QMOE_HD bool mxfp4_chunk_to_e4m3(const uint8_t* codes, const uint8_t* e8m0, int valid, float g,
                                 uint8_t* out, float* scale) {
  static_assert(kChunk % 32 == 0, "whole 32-K blocks");
  const int blocks = valid / 32;
  int cmax = 0;
  for (int h = 0; h < blocks; ++h) cmax = e8m0[h] > cmax ? e8m0[h] : cmax;
  bool exact = cmax <= 252;
  // 2^(cmax - 133): normal for cmax >= 7, else the subnormal 2^-149 * 2^(cmax + 16).
  const float p2 = cmax >= 7 ? num::bits_f32(static_cast<uint32_t>(cmax - 6) << 23)
                             : num::bits_f32(1u << (cmax + 16));
  const float s = g * p2;
  const uint32_t s_exp = (num::f32_bits(s) >> 23) & 0xFFu;
  exact = exact && (g == 0.0f || (s_exp != 0 && s_exp != 0xFF));
  *scale = s;
  for (int h = 0; h < kChunk / 32; ++h) {
    if (h >= blocks) {  // past K
      for (int j = 0; j < 32; ++j) out[h * 32 + j] = 0;
      continue;
    }
    const int d = cmax - e8m0[h];
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

// The decode kernels' layout of integer weights: codes arranged so that one 16-byte load per lane
// gives a warp the A fragments of `mma.sync.m16n8k16` for several K steps of a 16-row tile.
//
// Per expert: tiles of 16 packed rows x chunks of (16 * SC) k, SC = 16 / bits (rounded down) K
// steps per chunk (int2: 8, int3: 5, int4: 4, int8: 2). A chunk is 32 lanes x 4 words. Lane L (g =
// L / 4, t = L % 4) holds in K step s, as 4 pairs j = 0..3 (the A fragment registers in order), the
// codes
//   j = 0: rows g,     k = 16 s + 4 t + {0, 1}      j = 1: rows g + 8, k = 16 s + 4 t + {0, 1}
//   j = 2: rows g,     k = 16 s + 4 t + {2, 3}      j = 3: rows g + 8, k = 16 s + 4 t + {2, 3}
// (K is permuted inside each step so that a lane's activations are 4 consecutive values; A and B
// use the same permutation, so the dot product is unchanged). Pair G = 4 (s mod SC) + j of a chunk
// lives in word G / P, P = 16 / bits, at bit b (G mod P) of the low half (first code) and of the
// high half (second code): one shift and one mask put both codes in the mantissa of a bf16x2/f16x2.
// Padding (rows past N, k past K) holds the code 2^(bits-1).
//
// FP4 (E2M1 codes) uses the same tiles, chunks and pairs (SC = 4), with a bit layout of its own,
// chosen so that a pair becomes an A register with two rotations and two LOP3s and no table
// (mma_fp4_bit): a code's three magnitude bits go where they are the exponent's low bits and the
// mantissa's top bit of a bf16 (bits 6-8) or f16 (9-11), which makes the half exactly the E2M1
// value times 2^-126 (bf16) or 2^-14 (f16), subnormals included; its sign goes to bit 15. Pair j
// of a word (K step s = word index) has its low code's magnitude at bits (P + 3 j + i) mod 32 and
// its sign at (P + 12 + j) mod 32, its high code the same plus 16 (P: 6 bf16, 9 f16): the four
// pairs fill the 32 bits exactly, and the kernel rotates the word right by 3 j (magnitudes) and
// P - 3 + j (signs), five distinct rotations per word. Padding holds code 0 (+0).
//
// FP8 (e4m3 codes) uses int8's tiles, chunks and pairs (SC = 2, two pairs per word), with a bit
// layout of its own (mma_fp8_bit): a code's seven magnitude bits go where they are a 16-bit
// float's exponent's low four bits and mantissa's top three, bits 7-13 (f16: exactly e4m3 * 2^-8,
// subnormals included) or 4-10 (bf16: e4m3 * 2^-120, which an HMUL2 by 2^120 makes exact), its sign
// to bit 15. Pair jj of a word keeps its magnitudes at those bits rotated left by R(jj, mag) and
// its signs rotated by R(jj, sign) (mma_fp8_rot), so that the kernel gets a pair with at most two
// rotations and two LOP3s, and the two pairs fill the 32 bits exactly:
//   f16:  pair 0 as it lands (one mask);            pair 1 magnitudes +9, signs +15
//   bf16: pair 0 magnitudes as they land, signs +3; pair 1 magnitudes +7, signs +4
// (a search over every rotation found no layout with fewer instructions: a pair from one source
// takes one LOP3, from two sources two, and no two pairs of one word both come from one source).
// Padding holds code 0 (+0).
//
// Packed rows may be permuted relative to the FC's logical rows: for gated activations FC1's tile
// m holds the gate rows of units 8m..8m+7 in packed rows 0..7 and their linear rows in 8..15, so a
// thread's accumulators hold a gate and its linear partner.
#pragma once

#include <cstdint>
#include <vector>

#include "core/numeric.h"  // QMOE_HD
#include "qmoe/format.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe {

enum class MmaRowMap : uint8_t {
  kIdentity,           // packed row = logical row
  kGatedInterleaved,   // unit u: gate row 2u, linear row 2u + 1
  kGatedConcatenated,  // unit u: gate row u, linear row I + u
};

// What a packed code is: an integer (q - zp) or an E2M1 value; the FP4 formats differ in their
// scales (see nvfp4_multiplier).
// FP8: e4m3 codes (fp8 with a global scale per expert, block_size 0; fp8_block with its block
// scales per row in tile order, block_size its K block).
enum class MmaCodes : uint8_t { kInt, kNvFp4, kMxFp4, kFp8 };

struct MmaPackShape {
  MmaCodes codes = MmaCodes::kInt;
  int fp4_mag_bit = 6;  // FP4: where a code's magnitude starts in each half (6 bf16, 9 f16)
  int fp8_mag_bit = 7;  // FP8: likewise (4 bf16, 7 f16)
  // Rows sharing one source row of scales: fp8_block's block_size (square blocks), else 1.
  int64_t scale_rows = 1;
  // NVFP4: 16-K blocks over the padded K (chunks * 4), the row length of the tiled e4m3 scales.
  int64_t fp4_blocks = 0;
  int bits = 4;
  int steps_per_chunk = 4;  // SC
  int64_t n = 0, k = 0;     // logical rows and K
  int64_t units = 0;        // gated maps: I; identity: n
  int64_t tiles = 0;        // 16-row tiles per expert
  int64_t chunks = 0;       // chunks per tile
  MmaRowMap map = MmaRowMap::kIdentity;
  // Scale block along K; 0 per channel. NVFP4: 0, its fp32 scale per row is the global scale
  // (the e4m3 block scales become multipliers of the codes, see nvfp4_multiplier); MXFP4: 32.
  int block_size = 0;
  int64_t scale_blocks = 1;  // scale blocks over the padded K (chunks * 16 SC); 1 per channel

  // Host and device (the decode kernels index with these).
  QMOE_HD int64_t words_per_expert() const { return tiles * chunks * 128; }
  // ORT's scale blocks along K (the unpadded K): K / block_size rounded up (fp8_block's last block
  // may be partial; the integer formats' K is a multiple), 1 per channel.
  QMOE_HD int64_t k_blocks() const { return block_size ? (k + block_size - 1) / block_size : 1; }
  // The logical row of packed row pr, or -1 for padding.
  QMOE_HD int64_t logical_row(int64_t pr) const {
    if (map == MmaRowMap::kIdentity) return pr < n ? pr : -1;
    const int64_t unit = (pr / 16) * 8 + (pr % 8);
    if (unit >= units) return -1;
    const bool lin = (pr % 16) >= 8;
    if (map == MmaRowMap::kGatedInterleaved) return 2 * unit + (lin ? 1 : 0);
    return lin ? units + unit : unit;
  }
};

// Integer codes of 4 and 8 bits are step-major: the 16 bytes lane L (g = L / 4, t = L % 4) holds
// of a chunk, its words i = 0..3 (word G / P of pair G as above), do not lie together but one K
// step apart: word i of the lane is word mma_chunk_word(bits, L, i) of the chunk's 128, so that
// each K step is 512 / SC contiguous bytes of 32 lanes (int4: one word a lane, int8: two). Their
// pairs hold K in its natural order,
//   j = 0: rows g,     k = 16 s + 2 t + {0, 1}      j = 1: rows g + 8, k = 16 s + 2 t + {0, 1}
//   j = 2: rows g,     k = 16 s + 2 t + {8, 9}      j = 3: rows g + 8, k = 16 s + 2 t + {8, 9}
// (the fragment of mma.sync and of wgmma without a permutation), and each code is stored with its
// top bit flipped (q - 2^(bits-1) in two's complement; padding: 0). This is the mixed-input GEMM's
// shuffled order (cutlass_mixed_shuffle.cuh: its 16 x 16 atoms along k, a chunk is SC of them), so
// a layer whose GEMM copy has the same rows and K keeps one copy for both paths.
QMOE_HD constexpr bool mma_step_major(MmaCodes codes, int bits) {
  return codes == MmaCodes::kInt && (bits == 4 || bits == 8);
}
QMOE_HD constexpr int mma_chunk_word(int bits, int lane, int i) {
  const int per_step = bits / 4;  // words a lane holds of one K step: 4 / SC
  return (i / per_step) * 32 * per_step + lane * per_step + i % per_step;
}

// Whether the decode kernels read this FC: integer widths 2, 3, 4 or 8 (per channel or blocks of a
// power of two >= 16), NVFP4, MXFP4, fp8 or fp8_block (blocks of a power of two >= 32, a chunk);
// K a multiple of 16.
bool mma_pack_supported(const FcFormat& f, int64_t k);

// act: the activations' dtype, which picks the FP4 and FP8 bit layouts (bf16, else f16).
MmaPackShape mma_pack_shape(const FcFormat& f, int64_t n, int64_t k, MmaRowMap map, int64_t inter,
                            DType act = DType::kBF16);

// Packs the raw ORT codes ([E, N, ceil(K bits / 8)] LSB-first rows) of `experts` experts.
void mma_pack_int(const MmaPackShape& s, const uint8_t* raw, int64_t experts,
                  std::vector<uint32_t>* out);

// FP4: packs K-packed E2M1 codes ([E, N, K / 2], low nibble = even k) in the FP4 bit layout.
void mma_pack_fp4(const MmaPackShape& s, const uint8_t* raw, int64_t experts,
                  std::vector<uint32_t>* out);

// FP8: packs e4m3 codes ([E, N, K] bytes) in the FP8 bit layout. raw_linear (gated concatenated
// maps only): the linear rows from their own tensor [E, I, K] (a separate FC3), raw then holding
// the gate rows [E, I, K].
void mma_pack_fp8(const MmaPackShape& s, const uint8_t* raw, int64_t experts,
                  std::vector<uint32_t>* out, const uint8_t* raw_linear = nullptr);

// The FP8 layout's rotations (mma_pack.h's table): pair jj's magnitudes (sign false) or signs are
// stored at their target bits rotated left by this.
QMOE_HD constexpr int mma_fp8_rot(int mag_bit, int jj, bool sign) {
  return mag_bit == 4 ? (jj == 0 ? (sign ? 3 : 0) : (sign ? 4 : 7))
                      : (jj == 0 ? 0 : (sign ? 15 : 9));
}
QMOE_HD constexpr uint32_t mma_rotr(uint32_t w, int r) {
  return r == 0 ? w : (w >> r) | (w << (32 - r));
}
// Where the FP8 layout puts bit i of half h's code of pair jj (0, 1) of a word: i = 0..6 the
// magnitude, 7 the sign.
QMOE_HD constexpr int mma_fp8_bit(int mag_bit, int jj, int half, int i) {
  const int target = (i < 7 ? mag_bit + i : 15) + 16 * half;
  return (target + mma_fp8_rot(mag_bit, jj, i == 7)) % 32;
}
// Pair jj of word w as two 16-bit floats (f16: e4m3 * 2^-8; bf16: e4m3 * 2^-120), the kernel's
// arithmetic: rotations back, a mask each, an OR. Host and device (the kernel adds bf16's HMUL2).
QMOE_HD constexpr uint32_t mma_fp8_pair_bits(uint32_t w, int mag_bit, int jj) {
  const uint32_t mag = (0x7Fu << mag_bit) * 0x10001u;
  const int rm = mma_fp8_rot(mag_bit, jj, false), rs = mma_fp8_rot(mag_bit, jj, true);
  return rm == rs ? mma_rotr(w, rm) & (mag | 0x80008000u)
                  : (mma_rotr(w, rm) & mag) | (mma_rotr(w, rs) & 0x80008000u);
}
// The e4m3 code of half h of pair jj in word w (the inverse of mma_fp8_bit).
QMOE_HD unsigned mma_fp8_code(uint32_t w, int mag_bit, int jj, int half) {
  unsigned code = 0;
  for (int i = 0; i < 8; ++i) code |= ((w >> mma_fp8_bit(mag_bit, jj, half, i)) & 1u) << i;
  return code;
}
// FP8 with f16 activations: the fp32 sums of the decoded pairs times this are the sums of the
// e4m3 values (bf16's HMUL2 by 2^120 leaves them exact already).
constexpr int kFp8F16Shift = 8;

// Where the FP4 layout puts the bits of half h's code of pair j (0..3) of a word: bit i of the
// magnitude (i = 0..2) or the sign (i = 3).
QMOE_HD int mma_fp4_bit(int mag_bit, int j, int half, int i) {
  const int b = i < 3 ? mag_bit + 3 * j + i : mag_bit + 12 + j;
  return (b + 16 * half) % 32;
}
// The E2M1 code of half h of pair j in word w (the inverse of mma_fp4_bit).
QMOE_HD unsigned mma_fp4_code(uint32_t w, int mag_bit, int j, int half) {
  unsigned code = 0;
  for (int i = 0; i < 4; ++i) code |= ((w >> mma_fp4_bit(mag_bit, j, half, i)) & 1u) << i;
  return code;
}

// The shape the FP4 scales take in tile order (mma_pack_scales): NVFP4's e4m3 per 16-K block over
// the padded K (fp4_blocks per row), MXFP4's e8m0 per 32-K block (scale_blocks).
inline MmaPackShape mma_fp4_scale_shape(const MmaPackShape& s) {
  MmaPackShape blocks = s;
  if (s.codes == MmaCodes::kNvFp4) {
    blocks.block_size = 16;
    blocks.scale_blocks = s.fp4_blocks;
  }
  return blocks;
}

// The scales of an FP4 FC as the decode kernel applies them, each exactly. The packed copy keeps
// ORT's 8-bit scales (e4m3 per 16 K, e8m0 per 32 K) in tile order (mma_pack_scales; NVFP4 with
// blocks of 16 over the padded K, fp4_blocks per row) and the fp32 global scale per expert:
//   NVFP4: the kernel multiplies each decoded pair, E2M1 * 2^-126 (bf16) or 2^-14 (f16), by its
//          block's multiplier e4m3 * 2^(126 - c) or e4m3 * 2^(14 - c) (nvfp4_multiplier), which
//          gives E2M1 * scale * 2^-c exactly (at most 6 significant bits, inside both types'
//          ranges for every e4m3 value), and the tile's fp32 sums by global * 2^c once.
//   MXFP4: the decoded pairs are multiplied by the constant 2^126 (2^14), and the fp32 sums of
//          each 32-K block by e8m0 * global.
constexpr int nvfp4_mult_shift(bool bf16) { return bf16 ? 8 : 7; }
// 2^e as a float, at compile time (e in [-126, 127]).
constexpr float exp2_int(int e) {
  return e == 0 ? 1.0f : e > 0 ? 2.0f * exp2_int(e - 1) : 0.5f * exp2_int(e + 1);
}
// A multiplier over its e4m3 value: 2^(126 - c) (bf16) or 2^(14 - c) (f16). The kernels apply
// these (copy_fp4_scales) and nvfp4_multiplier below, so host and device share one definition.
constexpr float nvfp4_mult_factor(bool bf16) {
  return exp2_int((bf16 ? 126 : 14) - nvfp4_mult_shift(bf16));
}
// An e4m3 scale's multiplier, as a float (exact in the layout's 16-bit type).
float nvfp4_multiplier(uint8_t e4m3, bool bf16);

// Scales and zero points in tile order, so that a block copies the scales of consecutive tiles
// with 16-byte loads and no index arithmetic: entry (e, packed row pr, block b) sits at
//   ((e * tiles + pr / 16) * 16 + pr % 16) * scale_blocks + b
// (scale_blocks counts blocks over the padded K, so a tile's run is a multiple of 16 entries).
// fp8_block's square blocks become one entry per packed row and K block (scale_rows rows share a
// source row): a tile's 16 rows may lie in two blocks of rows (FC1's gate and linear halves).
// Scales keep their dtype's bytes (elem_bytes each; padding rows and blocks hold 0). Zero points
// become one byte per entry, the code value (padding holds 2^(bits-1), the symmetric point).
//   scales: ORT layout [E, N / scale_rows, K / block_size (1 per channel)], divisions rounded up;
//   zp: ORT's packed stream.
void mma_pack_scales(const MmaPackShape& s, const uint8_t* scales, int elem_bytes, int64_t experts,
                     std::vector<uint8_t>* out);
void mma_pack_zero_points(const MmaPackShape& s, const uint8_t* zp, int64_t experts,
                          std::vector<uint8_t>* out);
QMOE_HD int64_t mma_scale_index(const MmaPackShape& s, int64_t e, int64_t pr, int64_t b) {
  return ((e * s.tiles + pr / 16) * 16 + pr % 16) * s.scale_blocks + b;
}

// FC1 (gate) and a separate FC3 (linear) of one FP8 format packed as one gated concatenated FC
// (mma_pack_fp8's raw_linear): their scales as rows of that FC, [E, 2 I, k_blocks()] entries of
// elem_bytes (I = s.units), which mma_pack_scales takes with scale_rows 1. gate and linear are
// each FC's scales, [E, ceil(I / block_rows), k_blocks()]: fp8_block's blocks (block_rows its
// block size), or fp8's global scales [E] (block_rows I, one K block, f32).
void mma_gated_row_scales(const MmaPackShape& s, const uint8_t* gate, const uint8_t* linear,
                          int elem_bytes, int64_t block_rows, int64_t experts,
                          std::vector<uint8_t>* out);

// The code at (expert e, packed row pr, k) of a packed buffer (tests and tools).
unsigned mma_packed_code(const MmaPackShape& s, const uint32_t* packed, int64_t e, int64_t pr,
                         int64_t k);

}  // namespace qmoe

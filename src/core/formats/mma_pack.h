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

struct MmaPackShape {
  int bits = 4;
  int steps_per_chunk = 4;  // SC
  int64_t n = 0, k = 0;     // logical rows and K
  int64_t units = 0;        // gated maps: I; identity: n
  int64_t tiles = 0;        // 16-row tiles per expert
  int64_t chunks = 0;       // chunks per tile
  MmaRowMap map = MmaRowMap::kIdentity;
  int block_size = 0;        // scale block along K; 0 per channel
  int64_t scale_blocks = 1;  // scale blocks over the padded K (chunks * 16 SC); 1 per channel

  // Host and device (the decode kernels index with these).
  QMOE_HD int64_t words_per_expert() const { return tiles * chunks * 128; }
  // ORT's scale blocks along K (the unpadded K): K / block_size, 1 per channel.
  QMOE_HD int64_t k_blocks() const { return block_size ? k / block_size : 1; }
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

// Whether the decode kernels read this FC: integer widths 2, 3, 4 or 8; per channel or blocks of a
// power of two >= 16; K a multiple of 16.
bool mma_pack_supported(const FcFormat& f, int64_t k);

MmaPackShape mma_pack_shape(const FcFormat& f, int64_t n, int64_t k, MmaRowMap map, int64_t inter);

// Packs the raw ORT codes ([E, N, ceil(K bits / 8)] LSB-first rows) of `experts` experts.
void mma_pack_int(const MmaPackShape& s, const uint8_t* raw, int64_t experts,
                  std::vector<uint32_t>* out);

// Scales and zero points in tile order, so that a block copies the scales of consecutive tiles
// with 16-byte loads and no index arithmetic: entry (e, packed row pr, block b) sits at
//   ((e * tiles + pr / 16) * 16 + pr % 16) * scale_blocks + b
// (scale_blocks counts blocks over the padded K, so a tile's run is a multiple of 16 entries).
// Scales keep their dtype's bytes (elem_bytes each; padding rows and blocks hold 0). Zero points
// become one byte per entry, the code value (padding holds 2^(bits-1), the symmetric point).
//   scales: ORT layout [E, N, K / block_size (1 per channel)]; zp: ORT's packed stream.
void mma_pack_scales(const MmaPackShape& s, const uint8_t* scales, int elem_bytes, int64_t experts,
                     std::vector<uint8_t>* out);
void mma_pack_zero_points(const MmaPackShape& s, const uint8_t* zp, int64_t experts,
                          std::vector<uint8_t>* out);
QMOE_HD int64_t mma_scale_index(const MmaPackShape& s, int64_t e, int64_t pr, int64_t b) {
  return ((e * s.tiles + pr / 16) * 16 + pr % 16) * s.scale_blocks + b;
}

// The code at (expert e, packed row pr, k) of a packed buffer (tests and tools).
unsigned mma_packed_code(const MmaPackShape& s, const uint32_t* packed, int64_t e, int64_t pr,
                         int64_t k);

}  // namespace qmoe

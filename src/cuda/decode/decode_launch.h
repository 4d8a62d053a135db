// Internal to the decode kernel: what the launcher (decode_gemv.cu) derives once per launch and
// hands to the per-width instantiation files (decode_b2.cu ... decode_b8.cu), which compile in
// parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/decode/decode_gemv.h"
#include "qmoe/status.h"

namespace qmoe::cuda::decode_detail {

// 16-byte weight loads in flight per lane (the kernel's ring): one column group runs 6 blocks per
// SM (80 registers: 6 x 16 bytes per lane leave no spills), two run 4 with 8 loads each. The
// launcher needs it too: several tiles per block only when a warp's stream is at least a ring.
// The WIDE_RING measurement build (src/CMakeLists.txt) gives one column group 8 loads at 5 blocks
// per SM (96 registers) instead.
#if defined(QMOE_DECODE_ABLATE_WIDE_RING)
constexpr int decode_ring(int) { return 8; }
constexpr int decode_min_blocks(int mma_column_groups) { return mma_column_groups == 2 ? 4 : 5; }
#else
constexpr int decode_ring(int mma_column_groups) { return mma_column_groups == 2 ? 8 : 6; }
constexpr int decode_min_blocks(int mma_column_groups) { return mma_column_groups == 2 ? 4 : 6; }
#endif

// The most activation rows a pass stages: 8 routes per mma column group, at most two groups.
constexpr int kMaxRowsPerPass = 16;

struct DecodeGeometry {
  int tpb = 1;       // tiles per block: 1 (the warps split K) or a multiple of 4 (a warp per tile)
  int mc = 1;        // mma column groups of 8 routes (the kernel's kMC)
  int rows_cap = 8;  // activation rows staged per pass
  int nblk_pad = 1;  // scale blocks over the padded K (the extra ones hold scale 0)
  int shift = 30;    // log2(block_size); 30 per channel (every K in block 0)
  int kpad = 16;     // K rounded up to whole chunks: the staged rows are zero beyond K
  int ld = 24;       // staged row stride in halves: kpad + 8 (spreads the rows over the banks)
  // Steps per scale block inside a chunk, as the kernel's template argument: 1, 2 or 4 when
  // blocks are shorter than a chunk, 0 when a block spans whole chunks (and per channel), -1 when
  // blocks do not align with chunks (int3: 5 steps per chunk).
  int spb = 0;
};

// The kernel's dynamic shared memory: its tiles' scales (and zero points), their parked sums, a
// zero row, rows_cap rows.
inline size_t decode_smem_bytes(const DecodeGeometry& g, bool zero_points) {
  const size_t sums = g.tpb > 1 ? static_cast<size_t>(g.tpb) * g.mc * 128 * 4 : 0;
  return static_cast<size_t>(16) * g.tpb * g.nblk_pad * 4 * (zero_points ? 2 : 1) + sums +
         static_cast<size_t>(g.rows_cap + 1) * g.ld * 2;
}

// The opt-in shared memory of sm_90 (227 KiB) less the kernel's static reduction buffer.
constexpr int kMaxDynamicSmem = 227 * 1024 - 8 * 1024;  // static: red, at most 4 KiB

template <int kBits>
Status launch_decode_bits(const DecodeFcArgs& a, const DecodeGeometry& g, size_t smem,
                          int route_groups, cudaStream_t stream);
template <int kBits>
Status prepare_decode_bits();

}  // namespace qmoe::cuda::decode_detail

// Internal to the decode kernel: what the launcher (decode_gemv.cu) derives once per launch and
// hands to the per-width instantiation files (decode_b2.cu ... decode_b8.cu), which compile in
// parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/sm90.h"
#include "cuda/decode/decode_gemv.h"
#include "qmoe/status.h"

namespace qmoe::cuda::decode_detail {

// 16-byte weight loads in flight per lane in the register ring (decode_kernel.cuh). The compiler
// tracks a ring's loads with one dependency barrier, so a warp waits for all of them at once each
// time round; see kSmemRingSlots for the other ring. The kernel runs 6 blocks per SM at 80
// registers (kDecodeMinBlocks); a ring of 6 spilled there (40 bytes of stack) and lost to
// shorter rings at every width measured (H200, qwen3-30b-a3b, cold L2, 1 / 8 / 64 tokens): int4
// 28.8 / 75.8 / 175.5 us at 6, 27.2 / 67.0 / 155.7 at 4, 26.6 / 69.3 / 162.5 at 2; int8 38.1 /
// 118.9 / 283.1 at 6, 35.8 / 110.1 / 259.9 at 4, 37.6 / 119.8 / 288.4 at 2; int2 b64 27.3 / 76.6 /
// 176.8 at 6, 27.3 / 75.1 / 172.9 at 4, 26.1 / 67.6 / 153.4 at 2. So about 16 K steps ahead
// (int2 holds 8 per chunk, int3 5, int4 4) and 4 chunks for int8. The launcher needs it too:
// several tiles per block only when a warp's stream is at least a ring.
constexpr int decode_ring(int bits) { return bits == 2 ? 2 : bits == 3 ? 3 : 4; }
constexpr int kDecodeMinBlocks = 6;
constexpr int kDecodeWarps = 4;  // warps per block

// The shared-memory ring: kSmemRingSlots 16-byte slots per lane, all but one in flight while the
// lane decodes the oldest, each tracked on its own (cp.async groups), so that a warp waits only
// for the chunk it needs next and the ring's length costs no registers.
constexpr int kSmemRingSlots = 8;
constexpr int kRingSlotBytes = kDecodeWarps * 32 * 16;  // 16 bytes for each lane of a block
// The shortest stream of chunks per warp that takes the shared-memory ring (decode_gemv.cu); with
// one route per expert, where a block's staging is a single row, kSmemRingMinChunksOneRoute.
constexpr int kSmemRingMinChunks = 48;
constexpr int kSmemRingMinChunksOneRoute = 16;

struct DecodeGeometry {
  // Tiles per block: 1 or 2 (the warps split each tile's K: 4 or 2 warps a tile), or a multiple
  // of 4 (a warp per tile).
  int tpb = 1;
  int rows_cap = 8;  // activation rows staged per pass
  int nblk_pad = 1;  // scale blocks over the padded K (the extra ones hold scale 0)
  int shift = 30;    // log2(block_size); 30 per channel (every K in block 0)
  int kpad = 16;     // K rounded up to whole chunks: the staged rows are zero beyond K
  int ld = 16;       // staged row stride in halves: 16 modulo 32, at least kpad (geometry())
  // Steps per scale block inside a chunk, as the kernel's template argument: 1, 2 or 4 when
  // blocks are shorter than a chunk, 0 when a block spans whole chunks (and per channel), -1 when
  // blocks do not align with chunks (int3: 5 steps per chunk).
  int spb = 0;
  // Chunks per scale block where blocks span chunks (spb 0; per channel the whole K), else 1.
  int cpb = 1;
  // Chunks of the tile's last scale block where blocks span chunks (FP8 blocks: K need not be a
  // multiple of the block); cpb where it is.
  int cpb_last = 1;
  bool smem_ring = false;  // the weight ring in shared memory (else in registers)
  int mblk = 0;            // NVFP4: the multipliers' blocks per row (MmaPackShape::fp4_blocks)
  int prefetch = 0;        // register ring: rounds prefetched into L2 ahead of the loads
  // FC2 with the combine (DecodeFcArgs::combine): the route slots of a token, a cluster's
  // blocks (one route each); 0 otherwise.
  int combine = 0;
};

// The grid's blocks per expert (its x): the FC's tiles, g.tpb to a block.
inline int decode_blocks_per_expert(const DecodeFcArgs& a, const DecodeGeometry& g) {
  return static_cast<int>((a.shape.tiles + g.tpb - 1) / g.tpb);
}

// The kernel's forms (its kForm template argument): the weight ring in registers or in shared
// memory, either with the combine (FC2's blocks of a token's routes in a cluster that sums them).
constexpr int kFormRegisterRing = 0;
constexpr int kFormSharedRing = 1;
constexpr int kFormCombine = 2;
// The most route slots (top_k + shared experts) FC2 with the combine takes: the largest cluster
// sm_90 launches (16 blocks; past 8 on request, prepare_decode_kind).
constexpr int kCombineMaxSlots = 16;
// The blocks per multiprocessor FC2 with the combine needs room for in shared memory: a cluster's
// blocks all run at once on one GPC (an sm_90 GPC has 16 to 18 multiprocessors, some fewer where
// units are disabled), so that a cluster of 16 needs only 8 of them.
constexpr int kCombineMinBlocks = 2;

// Whether a block's warps split each of its tiles' K (fewer tiles per block than warps) rather
// than each owning whole tiles.
constexpr bool decode_split_k(int tpb) { return tpb < kDecodeWarps; }
// Split K: log2 of the warps on each tile (4 on one tile, 2 on each of two), so that the kernel
// finds a warp's part and tile by shifts and the launcher sizes a warp's stream alike.
static_assert(kDecodeWarps == 4, "split K: 4 warps on one tile or 2 on each of two");
constexpr int decode_split_shift(int tpb) { return tpb == 1 ? 2 : 1; }

// The kernel's dynamic shared memory: the weight ring if it is there, its tiles' scales (and zero
// points), their parked sums (a warp per tile), with the combine the cluster's gathered sums and
// the token's slots, NVFP4's multipliers, rows_cap rows.
inline size_t decode_smem_bytes(const DecodeGeometry& g, bool zero_points) {
  const size_t sums = decode_split_k(g.tpb) ? 0 : static_cast<size_t>(g.tpb) * 128 * 4;
  const size_t gathered =
      g.combine > 0 ? (static_cast<size_t>(g.combine) * g.tpb * 16 + 2 * kCombineMaxSlots) * 4 : 0;
  const size_t ring = g.smem_ring ? static_cast<size_t>(kSmemRingSlots) * kRingSlotBytes : 0;
  const size_t mult = static_cast<size_t>(32) * g.tpb * g.mblk;
  return ring + static_cast<size_t>(16) * g.tpb * g.nblk_pad * 4 * (zero_points ? 2 : 1) + sums +
         gathered + mult + static_cast<size_t>(g.rows_cap) * g.ld * 2;
}

// The opt-in shared memory of sm_90 less room for the kernel's static reduction buffer (2 KiB;
// the 8 KiB margin is the one every measured geometry was chosen with).
constexpr int kMaxDynamicSmem = static_cast<int>(kSm90SmemPerBlockOptin) - 8 * 1024;

// The decode kernel of one kind of codes (kBits, kCode = MmaCodes): its launch for a call, and
// its shared-memory opt-in (once per device), both from one instantiation list
// (decode_kernel.cuh's for_each_kernel). Instantiated by decode_b2.cu, decode_b3.cu,
// decode_b4.cu, decode_b8.cu (integer codes), decode_fp4.cu (NVFP4, MXFP4) and decode_fp8.cu.
constexpr int kIntCodes = static_cast<int>(MmaCodes::kInt);
constexpr int kNvFp4Codes = static_cast<int>(MmaCodes::kNvFp4);
constexpr int kMxFp4Codes = static_cast<int>(MmaCodes::kMxFp4);
constexpr int kFp8Codes = static_cast<int>(MmaCodes::kFp8);
template <int kBits, int kCode>
Status launch_decode_kind(const DecodeFcArgs& a, const DecodeGeometry& g, size_t smem,
                          cudaStream_t stream);
template <int kBits, int kCode>
Status prepare_decode_kind();

}  // namespace qmoe::cuda::decode_detail

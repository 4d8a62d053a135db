// The decode kernel (see decode_gemv.h), included once per code width by decode_b*.cu.
//
// Written for the HBM roofline at small token counts, where a block lives a few microseconds and
// every latency it serializes, and every instruction it issues, shows in the layer's time:
//   - the warp's weights stream through a ring of 16-byte chunks per lane, its first chunks
//     requested first: in registers (2 to 8 loads, decode_ring()), which the compiler waits for
//     all at once each time round, or for long streams in shared memory (kSmemRingSlots, filled
//     with cp.async), where the lane waits only for the chunk it decodes next;
//   - the tile's scales, zero points and the routes' activations are fetched in batches while
//     the first chunks are in flight, and staged in shared memory;
//   - the K loop has no bounds checks: the staged rows are zero past K up to whole chunks, and an
//     absent route's B fragment is route 0's (its mma column is never stored);
//   - where scale blocks start is known at compile time (kSpb) for every width but int3; where
//     blocks span chunks, and at tile ends, the loop counts chunks down (one test per chunk) and
//     keeps running addresses, so a chunk's bookkeeping is a few instructions next to its decode;
//   - the register ring's whole rounds run without tests; only the last two rounds check each
//     chunk against the stream's end.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>
#include <type_traits>

#include "core/formats/codec.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/stamps.cuh"
#include "cuda/decode/decode_common.cuh"
#include "cuda/decode/decode_gemv.h"
#include "cuda/decode/decode_launch.h"
#include "cuda/decode/decode_scales.cuh"

namespace qmoe::cuda::decode_detail {

// The register ring's chunks (decode_fc_kernel); none where the ring is in shared memory.
template <int kN>
struct RegisterRing {
  uint4 v[kN];
};
template <>
struct RegisterRing<0> {};

// Shared memory: scales [tiles_per_block * 16][nblk_pad] and zero points (same shape) as fp32, the
// staged activations [rows_cap][ld].
//
// A block owns tiles_per_block consecutive 16-row tiles of one expert. With one tile its 4 warps
// split K and add their partial sums in warp order (the most loads in flight per byte: one-token
// calls, where the whole layer is a few thousand tiles' worth of latency); with two, warps 0-1
// split the first tile's K and warps 2-3 the second's (half the blocks, where one tile per block
// takes a second wave of blocks, or where FC1's small tiles would leave FC2 no room: the
// launcher's rule, decode_gemv.cu). With 4 or more, each
// warp owns a quarter of the tiles over all of K, so the routes' activations are staged once for
// many tiles, no partial sums cross warps, and a warp's weights are one contiguous stream that its
// load ring follows across tile ends.
// kForm (decode_launch.h): the weight ring in registers or in shared memory (the launcher
// chooses), or FC2 with the combine (DecodeFcArgs::combine): blockIdx.y is then a route id
// (token t, slot j), the block's expert that route's, and a cluster of `slots` blocks holds one
// token's routes for the same tiles; each block hands its tiles' sums to the cluster's first
// block through distributed shared memory, which adds them as the finalize kernel does
// (combine_store). A slot of another shard's expert computes nothing and is skipped.
// One mma column group: 8 routes per pass (lane g reads route g's row). A second group (16 routes
// per pass, dispatch choice decode/2) lost to one at every count measured and was deleted
// (docs/cuda-backend.md).
// kCode: the codes (MmaCodes): integers, or E2M1 (kBits 4) in the FP4 layout, decoded by fp4_pair.
// NVFP4 multiplies each pair by its block's multiplier (copy_fp4_scales stages them in shared
// memory; a chunk's four per row are one 8-byte load) and its fp32 scale is the global one per row
// (kSpb 0, one block over K); MXFP4 multiplies by a constant and takes its e8m0 block scales on
// the fp32 sums every two K steps (kSpb 2), as the integer formats do.
// FP8 (kBits 8, kSpb 0): e4m3 codes decoded by fp8_pair; fp8's fp32 scale is the global one per
// row (or, FC1 and a separate FC3 packed as one, per-row fp32 scales), fp8_block's its block
// scales per row (tile order, blocks of whole chunks, the last one of a tile possibly shorter:
// geo.cpb_last).
template <int kBits, bool kBf16, int kSpb, int kForm, int kCode>
__global__ void __launch_bounds__(kWarps * 32, kDecodeMinBlocks)
    decode_fc_kernel(DecodeFcArgs a, DecodeGeometry geo) {
  constexpr bool kSmemRing = (kForm & kFormSharedRing) != 0;
  constexpr bool kCombine = (kForm & kFormCombine) != 0;
  constexpr bool kFp8 = kCode == static_cast<int>(MmaCodes::kFp8);
  constexpr bool kFp4 = kCode != static_cast<int>(MmaCodes::kInt) && !kFp8;
  constexpr bool kNvFp4 = kCode == static_cast<int>(MmaCodes::kNvFp4);
  static_assert(!kFp4 || (kBits == 4 && kSpb == (kNvFp4 ? 0 : 2)),
                "FP4 codes are 4 bits; NVFP4 has one fp32 scale block, MXFP4 two K steps each");
  static_assert(!kFp8 || (kBits == 8 && kSpb == 0),
                "FP8 codes are 8 bits, their scale blocks whole chunks (or one per row)");
  constexpr int kSteps = 16 / kBits;  // K steps per 16-byte chunk (int3: 5 pairs per half word)
  constexpr int kPairsPerWord = 16 / kBits;
  constexpr int kChunkK = 16 * kSteps;
  // int4 and int8 chunks are step-major (mma_pack.h): the lane's words a K step apart, K in its
  // natural order, codes with their top bits flipped.
  constexpr bool kStepMajor = mma_step_major(static_cast<MmaCodes>(kCode), kBits);
  constexpr int kLaneWords = kStepMajor ? kBits / 4 : 4;  // mma_chunk_word(kBits, lane, 0) / lane
  // The weight ring's chunks in flight per lane while one decodes. Registers: kRing (the ring2
  // and ring4 measurement builds force 2 or 4 at every width; the launcher's choice of tiles per
  // block still assumes decode_ring(), which only makes it more cautious where that is longer).
  // Shared memory: kAhead, slot s of lane l at s * kSlotBytes + 16 l.
#if defined(QMOE_DECODE_ABLATE_RING2)
  constexpr int kRing = 2;
#elif defined(QMOE_DECODE_ABLATE_RING4)
  constexpr int kRing = 4;
#else
  constexpr int kRing = decode_ring(kBits);
#endif
  constexpr int kSlots = kSmemRing ? kSmemRingSlots : 0;
  constexpr int kAhead = kSmemRingSlots - 1;
  constexpr uint32_t kSlotBytes = kRingSlotBytes;
  static_assert(kRingSlotBytes == kWarps * 32 * 16, "a slot holds 16 bytes per lane");
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[kWarps][4][32];  // split K: warps 1.. hand warp 0 their partial sums
  const int nbp = geo.nblk_pad;
  const bool has_zp = a.zero_points != nullptr;
  float* sc = reinterpret_cast<float*>(smem + kSlots * kSlotBytes);
  float* zs = sc + geo.tpb * 16 * nbp;
  // Several tiles: each finished tile's sums wait here, [tile][4][32], for the epilogues
  // after the warp's stream (run inside it, with the load ring live, they made the kernel spill).
  float* sums = zs + (has_zp ? geo.tpb * 16 * nbp : 0);
  // The combine: the cluster's sums, [slot][tile][16 rows] (the first block's are read), and the
  // token's slots' experts (local, -1 for another shard's) and weights.
  float* gathered = nullptr;
  int32_t* cs_e = nullptr;
  float* cs_w = nullptr;
  // NVFP4's multipliers, [tiles_per_block * 16][mblk] 16-bit values.
  uint16_t* msm = reinterpret_cast<uint16_t*>(sums + (decode_split_k(geo.tpb) ? 0 : geo.tpb * 128));
  if constexpr (kCombine) {
    gathered = reinterpret_cast<float*>(msm);
    cs_e = reinterpret_cast<int32_t*>(gathered + geo.combine * geo.tpb * 16);
    cs_w = reinterpret_cast<float*>(cs_e + kCombineMaxSlots);
    msm = reinterpret_cast<uint16_t*>(cs_w + kCombineMaxSlots);
  }
  uint16_t* xs = msm + (kNvFp4 ? geo.tpb * 16 * geo.mblk : 0);
  const int tid = static_cast<int>(threadIdx.x);

  QMOE_STAMP_SCOPE(a.fc1 ? 0 : 1);
  if constexpr (kCombine) cluster_arrive_relaxed();  // this block runs (cluster_wait below)
  if (a.fc1) {  // the touched list and the maps come from the routing just before
    pdl_wait();
    pdl_trigger();
    QMOE_STAMP_WAITED(0);
  }
  // The combine: route blockIdx.y (token t, slot j), its expert (if this shard's) and position;
  // the cluster's first block (slot 0) keeps every slot's expert and weight for the sums.
  // Otherwise entries past the touched experts hold -1 (stages.h): one dependent load, not two,
  // before the weights' addresses are known.
  const CombineRoute route = kCombine ? combine_route(a, cs_e, cs_w, tid) : CombineRoute{};
  const bool held = !kCombine || route.held;
  const int64_t e = kCombine ? route.e : a.touched[blockIdx.y];
  if (!kCombine && e < 0) return;
  const int off = kCombine ? route.off : a.offsets[e];
  const int cnt = kCombine ? (held ? 1 : 0) : a.offsets[e + 1] - off;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const MmaPackShape& s = a.shape;
  const int chunks = static_cast<int>(s.chunks);
  const int m0 = static_cast<int>(blockIdx.x) * geo.tpb;
  const int tiles_here = min(geo.tpb, static_cast<int>(s.tiles) - m0);
  const int ntl = held ? tiles_here : 0;  // another shard's route: no stream, no scales

  // The warp's stream: tiles [t0, t1) of the block, chunks [c0, c1) of each; consecutive in
  // memory either way (split K: one tile, the warp's part of its K).
  const bool split_k = decode_split_k(geo.tpb);
  int c0 = 0, c1 = chunks, t0 = 0, t1 = ntl;
  // Split K: 2^wsh warps a tile (shifts, not divisions by a runtime count: this prologue runs
  // once per warp, and the one-token calls are little else).
  const int wsh = decode_split_shift(geo.tpb);
  if (split_k) {
    const int part = warp & ((1 << wsh) - 1);
    c0 = (chunks * part) >> wsh;
    c1 = (chunks * (part + 1)) >> wsh;
    t0 = min(warp >> wsh, ntl);  // the block's last tile may be missing: an empty stream
    t1 = min(t0 + 1, ntl);
  } else {
    const int q = geo.tpb / kWarps;
    t0 = min(warp * q, ntl);
    t1 = min(t0 + q, ntl);
  }
  const int nw = c1 - c0;
  const int total = (t1 - t0) * nw;
  const uint32_t* wchunk =
      a.packed + e * s.words_per_expert() + (static_cast<int64_t>(m0 + t0) * chunks + c0) * 128;
  const uint32_t* wstart = wchunk + lane * kLaneWords;  // the lane's first word (its loads)
  // The shared-memory ring copies each chunk as it lies, 16 bytes a lane; step-major lanes then
  // read their words from the whole warp's copy (lds_step_major).
  const uint32_t* wcopy = wchunk + lane * 4;

  // 1. The warp's first chunks go out now: kRing loads, or kAhead copies of one commit group
  //    each (empty past the stream, so that the K loop's wait counts hold however long it is).
  // Only the ring in use exists: the registers' (RegisterRing<0> holds none), or the lane's first
  // slot in shared memory (0 where the ring is in registers).
  RegisterRing<kSmemRing ? 0 : kRing> ring;
  const uint32_t ring0 = kSmemRing ? smem_u32(smem) + static_cast<uint32_t>(tid) * 16 : 0u;
  // Where the lane reads a slot: its own 16 bytes, or (step-major) its words of the warp's chunk.
  const uint32_t read_delta =
      kStepMajor ? static_cast<uint32_t>(lane) * (4 * kLaneWords) - static_cast<uint32_t>(lane) * 16
                 : 0u;
  auto load_chunk = [&](const uint32_t* p) {
    if constexpr (kStepMajor) {
      return load_step_major<kBits>(p);
    } else {
      return load_stream(p);
    }
  };
  auto read_slot = [&](uint32_t addr) {
    if constexpr (kStepMajor) {
      __syncwarp();  // every lane's copy of the chunk has landed (each waited for its own)
      return lds_step_major<kBits>(addr + read_delta);
    } else {
      return lds128(addr);
    }
  };
  auto fill_ring = [&]() {
    if constexpr (kSmemRing) {
#pragma unroll
      for (int i = 0; i < kAhead; ++i) {
        if (i < total) cp_async16(ring0 + i * kSlotBytes, wcopy + i * 128);
        cp_async_commit();
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRing; ++i) {
        if (i < total) ring.v[i] = load_chunk(wstart + i * 128);
      }
    }
  };
  fill_ring();
  // The register ring's L2 prefetch, geo.prefetch rounds (of kRing chunks) ahead of its loads, so
  // that those, which the ring waits for all at once, see L2's latency: lane l asks for the l-th
  // 128-byte line of a run of chunks (4 lines each), one instruction for a round. First the
  // chunks after the ring's first loads, then, in the K loop, a round at a time.
  const uint32_t* wline = wchunk + lane * 32;  // the warp's stream, plus 128 bytes per lane
  if (!kSmemRing && geo.prefetch > 0) {
    for (int l0 = 0; l0 < geo.prefetch * kRing * 4; l0 += 32) {
      if (l0 + lane < geo.prefetch * kRing * 4 && kRing + (l0 + lane) / 4 < total) {
        prefetch_l2(wline + kRing * 128 + l0 * 32);
      }
    }
  }

  // 2. The block's tiles' scales and zero points.
  if constexpr (kFp8) {
    if (a.scales == nullptr) {  // fp8: the expert's global scale on every row
      const float g = a.global[e];
      for (int i = tid; i < ntl * 16; i += kWarps * 32) sc[i] = g;
    } else {
      copy_scales(a, (e * s.tiles + m0) * 16 * nbp, ntl * 16 * nbp, sc, zs, tid);
    }
  } else if constexpr (kFp4) {
    copy_fp4_scales<kCode, kBf16>(a, e, m0, ntl, nbp, geo.mblk, sc, msm, tid);
  } else {
    copy_scales(a, (e * s.tiles + m0) * 16 * nbp, ntl * 16 * nbp, sc, zs, tid);
  }

  // FC2's activations are FC1's output: its expert's FC1 blocks counted done (DecodeFcArgs::
  // ready; read then with coherent loads), or FC1's whole grid.
  const bool counted = !a.fc1 && a.ready_target > 0;
  if (!a.fc1) {
    if (counted) {
      if (tid == 0 && held) wait_count(a.ready + e, a.ready_target);
      __syncthreads();
    } else {
      pdl_wait();
    }
    pdl_trigger();
    QMOE_STAMP_WAITED(1);
  }
  auto load_x = [counted](const uint4* p) { return counted ? __ldcg(p) : __ldg(p); };

  const float mid = static_cast<float>(1 << (kBits - 1));
  const bool check = a.error != nullptr && blockIdx.x == 0;  // tile 0 sees every activation
  const int pieces = geo.kpad / 8, real_pieces = static_cast<int>(s.k) / 8;
  const int bs_mask = (1 << geo.shift) - 1;

  // The combine: every block of the cluster runs before any hands its sums to the first (long
  // since: they start together), and each thread waits once, held route or not.
  if constexpr (kCombine) cluster_wait();
  for (int p0 = 0; p0 < cnt; p0 += geo.rows_cap) {
    const int rows = min(geo.rows_cap, cnt - p0);
    if (p0 > 0) {  // another pass: the weights again (mostly from L2), after every warp is done
      __syncthreads();
      fill_ring();
    }
    // 3. Stage the pass's activation rows, zeros past K, row by row: two 16-byte loads in flight
    //    per thread (more would spill next to the register ring). Measured against the flattened
    //    (row, piece) range (two divisions per load) and against cp.async with every piece in
    //    flight: within 1-3% either way, this form the fastest at one token (docs/cuda-backend.md).
    for (int r = 0; r < rows; ++r) {
      const int p = off + p0 + r;
      const int64_t row = a.by_token ? a.permuted_route[p] / a.slots : p;
      const uint4* src =
          reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + row * a.ldx);
      uint16_t* dst = xs + r * geo.ld;
      if constexpr (kStepMajor) {
        // Natural-K codes: each 16 values k0..k0 + 15 are staged so that lane t's four, k0 +
        // 2 t + {0, 1} and k0 + 2 t + {8, 9}, lie together (the B fragment's one 8-byte load):
        // pair words a0..a3 (k0..k0 + 7) and b0..b3 (k0 + 8..) as a0 b0 a1 b1 a2 b2 a3 b3.
        // Pieces and real pieces are even (K a multiple of 16).
        for (int q = tid; q < pieces / 2; q += kWarps * 32) {
          uint4 v[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int piece = 2 * q + u;
            v[u] = piece < real_pieces ? load_x(src + piece) : make_uint4(0u, 0u, 0u, 0u);
            if (check && (nonfinite16x8(v[u], kBf16))) {
              atomicOr(a.error, 4);
              atomicMin(a.error + 1, a.permuted_route[p] / a.slots);
            }
          }
          uint4* out = reinterpret_cast<uint4*>(dst + q * 16);
          out[0] = make_uint4(v[0].x, v[1].x, v[0].y, v[1].y);
          out[1] = make_uint4(v[0].z, v[1].z, v[0].w, v[1].w);
        }
      } else {
        for (int p0c = tid; p0c < pieces; p0c += 2 * kWarps * 32) {
          uint4 v[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int piece = p0c + u * kWarps * 32;
            v[u] = piece < real_pieces ? load_x(src + piece) : make_uint4(0u, 0u, 0u, 0u);
          }
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int piece = p0c + u * kWarps * 32;
            if (piece >= pieces) continue;
            if (check && nonfinite16x8(v[u], kBf16)) {  // the error word names the first such token
              atomicOr(a.error, 4);
              atomicMin(a.error + 1, a.permuted_route[p] / a.slots);
            }
            *reinterpret_cast<uint4*>(dst + piece * 8) = v[u];
          }
        }
      }
    }
    __syncthreads();

    // 4. The K loop: per step, 4 A registers from the codes, one mma per 8 routes.
    float acc[4], blk[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] = blk[i] = 0.0f;
    float s0 = 0.0f, s1 = 0.0f, z0 = mid, z1 = mid;
    // Each window position's (base + zp) for rows g and g + 8 (code_windows.h): constant without
    // zero points, set again with each scale block's zero points otherwise.
    constexpr int kNPos = window_positions<kBits, kBf16>();
    uint32_t subs0[kNPos], subs1[kNPos];
    auto set_subs = [&]() {
#pragma unroll
      for (int i = 0; i < kNPos; ++i) {
        subs0[i] = pair_of<kBf16>(window_base<kBits, kBf16>(i) + z0);
        subs1[i] = pair_of<kBf16>(window_base<kBits, kBf16>(i) + z1);
      }
    };
    set_subs();
    auto flush = [&]() {
      if constexpr (kFp8 && !kBf16) {  // f16 pairs are e4m3 * 2^-8: the sums times 2^8, exact
        constexpr float kBack = exp2_int(kFp8F16Shift);
#pragma unroll
        for (int i = 0; i < 4; ++i) blk[i] = blk[i] * kBack;
      }
      acc[0] = fmaf(s0, blk[0], acc[0]);
      acc[1] = fmaf(s0, blk[1], acc[1]);
      acc[2] = fmaf(s1, blk[2], acc[2]);
      acc[3] = fmaf(s1, blk[3], acc[3]);
#pragma unroll
      for (int i = 0; i < 4; ++i) blk[i] = 0.0f;
    };
    // The K loop's running state, so that a chunk costs its decode and little else (the tests a
    // chunk once made, where its tile and scale block start, cost a third of its instructions):
    // the lane's B fragment addresses at the chunk's start, the current scale block's entry, and a
    // count down to the next scale block's or tile's end, tested once per chunk.
    int tile = t0;
    int srow = (tile * 16 + g) * nbp;  // the tile's first row-g entry of the scales
    const int nbp8 = 8 * nbp;
    auto load_scale = [&](int b) {  // b: the row-g entry of the scale block
      s0 = sc[b];
      s1 = sc[b + nbp8];
      if (has_zp) {
        z0 = zs[b];
        z1 = zs[b + nbp8];
        set_subs();
      }
    };
    // The lane's B fragment at the chunk's start: lane g reads route g's row (an mma column). A
    // column past the pass's routes reads route 0's row (a broadcast of lane t's read): its sums
    // are never stored (epilogue() skips it), so it needs no row of zeros in shared memory, which
    // at one route and long K was half the block's staging (Mixtral-8x7B's FC2: 2 blocks per SM).
    const uint16_t* xa = xs + (g < rows ? g : 0) * geo.ld + 4 * t + kChunkK * c0;
    // kSpb == 0: chunks to the current scale block's end; its row-g entry (sp - srow counts the
    // tile's blocks: nbp of them, chunks / cpb).
    int left = geo.cpb - c0 % geo.cpb;
    // FP8 blocks: the tile's last block may be shorter (K not a multiple of the block).
    if constexpr (kFp8) left = min(left, chunks - c0);
    int sp = srow + (kSpb > 0 ? c0 * (kSteps / (kSpb > 0 ? kSpb : 1)) : c0 / geo.cpb);
    int tleft = nw;         // kSpb != 0: chunks to the tile's end
    int kc = kChunkK * c0;  // kSpb < 0: the chunk's K offset
    int bound = kc;         // kSpb < 0: where the current block ends
    if (kSpb == 0 && total > 0) load_scale(sp);
    // NVFP4: the lane's row-g multipliers at the chunk's start (row g + 8's are 8 mblk further).
    const int mblk8 = 8 * geo.mblk;
    const uint16_t* mp = msm + (tile * 16 + g) * geo.mblk + 4 * c0;
    auto process = [&](const uint4& wv) {
      const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
      // NVFP4: rows g (mv0) and g + 8 (mv1); .x holds steps 0-1, .y steps 2-3.
      uint2 mv0 = make_uint2(0u, 0u), mv1 = make_uint2(0u, 0u);
      if constexpr (kNvFp4) {
        mv0 = *reinterpret_cast<const uint2*>(mp);
        mv1 = *reinterpret_cast<const uint2*>(mp + mblk8);
      }
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        if constexpr (kSpb > 0) {
          if (st % kSpb == 0) {
            flush();
            load_scale(sp + st / kSpb);
          }
        } else if constexpr (kSpb < 0) {
          const int kp = kc + 16 * st;
          if (kp >= bound) {  // warp-uniform
            flush();
            load_scale(srow + (kp >> geo.shift));
            bound = (kp & ~bs_mask) + bs_mask + 1;
          }
        }
        uint32_t af[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int pair = 4 * st + j;
          const uint32_t word = w[pair / kPairsPerWord];
          const int jj = pair % kPairsPerWord;
          if constexpr (kFp8) {
            af[j] = fp8_pair<kBf16>(word, jj);
          } else if constexpr (kFp4) {
            uint32_t mult = kFp4Unit<kBf16>;
            if constexpr (kNvFp4) {
              const uint2 mv = (j & 1) ? mv1 : mv0;
              mult = dup_half<kBf16>(st < 2 ? mv.x : mv.y, st & 1);
            }
            af[j] = fp4_pair<kBf16>(word, jj, mult);
          } else if constexpr (kUsesWindows<kBits, kBf16>) {
            const int i = Windows<kBits, kBf16>::position_index(jj);
            af[j] = window_pair<kBits, kBf16, kStepMajor>(word, jj, (j & 1) ? subs1[i] : subs0[i]);
          } else {  // int8 with bf16 (step-major)
            af[j] = int8_pair_bf16(word, jj, (j & 1) ? subs1[0] : subs0[0]);
          }
        }
        const uint2 bv = *reinterpret_cast<const uint2*>(xa + 16 * st);
        mma16816<kBf16>(blk, af, bv.x, bv.y);
#if defined(QMOE_DECODE_ABLATE_NO_KPAIR)
        flush();  // the scale after every K step instead of once per scale block
#endif
      }
    };
    // A tile's end (not in split K, whose one tile ends with the stream): its sums are parked and
    // the state moves to the next tile. Returns false after the warp's last tile.
    auto next_tile = [&]() {
      flush();
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        sums[(tile * 4 + r) * 32 + lane] = acc[r];
        acc[r] = 0.0f;
      }
      xa -= kChunkK * nw;  // a tile is nw chunks: back to its start
      ++tile;
      if constexpr (kNvFp4) mp = msm + (tile * 16 + g) * geo.mblk;
      srow += 16 * nbp;
      sp = srow;
      tleft = nw;
      kc = 0;
      bound = 0;
      return tile < t1;
    };
    // After each chunk: the running state moves on; at a scale block's end (blocks spanning
    // chunks) its sums take the scale and the next block's scale is read; at a tile's end, the
    // next tile.
    auto step = [&](const uint4& wv) {
      process(wv);
      xa += kChunkK;
      if constexpr (kSpb > 0) sp += kSteps / kSpb;
      if constexpr (kSpb < 0) kc += kChunkK;
      if constexpr (kNvFp4) mp += kSteps;  // a block per K step
      if constexpr (kSpb == 0) {
        if (--left == 0) {
          flush();
          if (++sp - srow == nbp) {               // the tile's last block
            if (split_k || !next_tile()) return;  // the stream's end
          }
          left = geo.cpb;
          if constexpr (kFp8) {
            if (sp - srow == nbp - 1) left = geo.cpb_last;
          }
          load_scale(sp);
        }
      } else {
        if (--tleft == 0 && !split_k) next_tile();
      }
    };
    if constexpr (kSmemRing) {
      // Chunk j sits in slot j % kSmemRingSlots. Once it is read, the slot read one chunk earlier
      // (its value already decoded) takes chunk j + kAhead. Whole turns of the ring whose copies
      // stay inside the stream run unrolled, slots at constant offsets and no tests; the rest
      // (fewer than two turns) with running pointers and a test per chunk.
      const uint32_t* wnext = wcopy + kAhead * 128;
      int j = 0;
      for (; j + kSmemRingSlots + kAhead <= total; j += kSmemRingSlots) {
#pragma unroll
        for (int i = 0; i < kSmemRingSlots; ++i) {
          cp_async_wait<kAhead - 1>();  // groups complete in order: chunk j + i's has
          const uint4 wv = read_slot(ring0 + i * kSlotBytes);
          cp_async16(ring0 + ((i + kAhead) % kSmemRingSlots) * kSlotBytes, wnext + i * 128);
          cp_async_commit();
          step(wv);
        }
        wnext += kSmemRingSlots * 128;
      }
      const uint32_t ring_end = ring0 + kSmemRingSlots * kSlotBytes;
      uint32_t rd = ring0, wr = ring0 + kAhead * kSlotBytes;  // j is a whole number of turns
      for (; j < total; ++j) {
        cp_async_wait<kAhead - 1>();
        const uint4 wv = read_slot(rd);
        if (j + kAhead < total) cp_async16(wr, wnext);
        cp_async_commit();
        wnext += 128;
        wr = rd;
        rd = rd + kSlotBytes == ring_end ? ring0 : rd + kSlotBytes;
        step(wv);
      }
    } else {
      // A ring slot is refilled after its chunk is decoded (no copy) with the chunk kRing ahead.
      // Whole rounds whose refills stay inside the stream run without tests; the last chunks
      // (fewer than two rounds) test each chunk and refill.
      const uint32_t* wnext = wstart + kRing * 128;
      int jb = 0;
      // The round at jb prefetches chunks [jb, jb + kRing) + (1 + geo.prefetch) kRing while they
      // lie inside the stream.
      const uint32_t* wpf = wline + (1 + geo.prefetch) * kRing * 128;
      const int pf_last = geo.prefetch > 0 ? total - (2 + geo.prefetch) * kRing : -1;
      const bool pf_lane = lane < 4 * kRing;
      for (; jb + 2 * kRing <= total; jb += kRing) {
        if (pf_lane && jb <= pf_last) prefetch_l2(wpf);
        wpf += kRing * 128;
#pragma unroll
        for (int i = 0; i < kRing; ++i) {
          step(ring.v[i]);
          ring.v[i] = load_chunk(wnext + i * 128);
        }
        wnext += kRing * 128;
      }
      for (; jb < total; jb += kRing) {
#pragma unroll
        for (int i = 0; i < kRing; ++i) {
          if (jb + i < total) {
            step(ring.v[i]);
            if (jb + i + kRing < total) ring.v[i] = load_chunk(wnext + i * 128);
          }
        }
        wnext += kRing * 128;
      }
    }
    if (!split_k) {  // the epilogues of the warp's tiles (each lane reads what it wrote)
      for (int tl = t0; tl < t1; ++tl) {
        const int m = m0 + tl;
        const int64_t lr0 = s.logical_row(16 * m + g), lr1 = s.logical_row(16 * m + g + 8);
        const float* f = sums + tl * 128 + lane;
        const float v[4] = {f[0], f[32], f[64], f[96]};
        if constexpr (kCombine) {
          hand_to_first(gathered, tl, g, t, v, geo.tpb);
        } else {
          epilogue(a, e, m, g, lr0, lr1, off + p0, rows, 2 * t, v, kBf16);
        }
      }
      continue;
    }
    flush();

    // 5. Split K: a tile's partial sums, added in part order by its first warp, then the
    //    epilogue (the order depends on tiles_per_block only, never on the grid).
    const int part = warp & ((1 << wsh) - 1);  // again, not kept live through the K loop
    if (part > 0) {
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
    }
    __syncthreads();
    if (part == 0 && t0 < t1) {
      const int m = m0 + t0;
      const int64_t lr0 = s.logical_row(16 * m + g), lr1 = s.logical_row(16 * m + g + 8);
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float sum = acc[i];
        for (int w = 1; w < (1 << wsh); ++w) sum = sum + red[warp + w][i][lane];
        v[i] = sum;
      }
      if constexpr (kCombine) {
        hand_to_first(gathered, t0, g, t, v, geo.tpb);
      } else {
        epilogue(a, e, m, g, lr0, lr1, off + p0, rows, 2 * t, v, kBf16);
      }
    }
  }
  if (a.fc1 && a.ready != nullptr) {  // the block's rows are stored: count it (a release)
    __syncthreads();
    if (tid == 0) release_add(a.ready + e, 1);
  }
  if constexpr (kCombine) {  // every slot's sums are in the first block: the token's rows
    cluster_sync();
    if (blockIdx.y % a.terms.slots == 0) {
      for (int i = tid; i < tiles_here * 16; i += kWarps * 32) {
        combine_store(a, m0, i, gathered, cs_e, cs_w, geo.tpb);
      }
    }
  }
  if (counted) pdl_wait();  // FC2's end implies FC1's, as with the wait at the start
}

template <int kBits, bool kBf16, int kSpb, int kCode = 0>
Status launch_one(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                  cudaStream_t stream) {
  const bool combine = geo.combine > 0;
  const dim3 grid(static_cast<unsigned>(decode_blocks_per_expert(a, geo)),
                  static_cast<unsigned>(combine ? a.terms.tokens * a.terms.slots : a.max_groups));
  constexpr int kComb = kFormCombine, kShared = kFormSharedRing, kRegs = kFormRegisterRing;
  auto* kernel =
      combine ? (geo.smem_ring ? &decode_fc_kernel<kBits, kBf16, kSpb, kComb | kShared, kCode>
                               : &decode_fc_kernel<kBits, kBf16, kSpb, kComb | kRegs, kCode>)
      : geo.smem_ring ? &decode_fc_kernel<kBits, kBf16, kSpb, kShared, kCode>
                      : &decode_fc_kernel<kBits, kBf16, kSpb, kRegs, kCode>;
  // The combine: a cluster per token (its slots' blocks of the same tiles).
  const dim3 cluster(1, combine ? static_cast<unsigned>(a.terms.slots) : 1u, 1);
  QMOE_CUDA_TRY(launch_cluster_maybe_pdl(kernel, grid, dim3(kWarps * 32), cluster, smem, stream,
                                         a.pdl, a, geo));
  QMOE_CUDA_CHECK_LAUNCH("decode_fc_kernel");
  return Status::ok();
}

// The scale-block variants (kSpb) a kind of codes has: 16-byte chunks of int2 hold 8 K steps
// (blocks of 1, 2 or 4 steps inside one), int4 4 steps (1 or 2), int8 2 steps (1); int3 chunks of
// 5 steps never align with power-of-two blocks; NVFP4 has one fp32 block over K, MXFP4 blocks of
// two K steps, FP8 blocks of whole chunks (or one per row).
template <int kBits, int kCode>
constexpr bool has_spb(int spb) {
  if constexpr (kCode == static_cast<int>(MmaCodes::kMxFp4)) {
    return spb == 2;
  } else if constexpr (kCode != static_cast<int>(MmaCodes::kInt)) {
    return spb == 0;
  } else if constexpr (kBits == 3) {
    return spb == -1;
  } else {
    return spb == 0 || (spb > 0 && spb < 16 / kBits);
  }
}

// The instantiation list of one kind of codes: f(bf16, kSpb) as integral constants, for both
// activation dtypes and the kind's scale-block variants, in order, stopping at the first error.
// The launch switch and the shared-memory opt-in both walk it, so that every kernel launched was
// opted in.
template <int kBits, int kCode, typename F>
Status for_each_kernel(F&& f) {
  Status st = Status::ok();
  auto each_spb = [&](auto bf16) {
    auto one = [&](auto spb) {
      if constexpr (has_spb<kBits, kCode>(decltype(spb)::value)) {
        if (st.is_ok()) st = f(bf16, spb);
      }
    };
    one(std::integral_constant<int, -1>{});
    one(std::integral_constant<int, 0>{});
    one(std::integral_constant<int, 1>{});
    one(std::integral_constant<int, 2>{});
    one(std::integral_constant<int, 4>{});
  };
  each_spb(std::true_type{});
  each_spb(std::false_type{});
  return st;
}

// The launch of the kind's kernel for the call's dtype and, for integer codes, the geometry's
// scale-block variant (the other kinds have one each).
template <int kBits, int kCode>
Status launch_decode_kind(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                          cudaStream_t stream) {
  constexpr bool kInt = kCode == static_cast<int>(MmaCodes::kInt);
  const bool bf16 = a.dtype == DType::kBF16;
  bool launched = false;
  const Status st = for_each_kernel<kBits, kCode>([&](auto b, auto spb) -> Status {
    if (launched || b.value != bf16 || (kInt && spb.value != geo.spb)) return Status::ok();
    launched = true;
    return launch_one<kBits, decltype(b)::value, decltype(spb)::value, kCode>(a, geo, smem, stream);
  });
  QMOE_RETURN_IF_ERROR(st);
  if (!launched) {
    return Status::internal("decode: no kernel for " + std::to_string(kBits) + "-bit codes (kind " +
                            std::to_string(kCode) + "), " + std::to_string(geo.spb) +
                            " steps per scale block");
  }
  return Status::ok();
}

// Once per device, outside capture: every kernel of the kind may take kMaxDynamicSmem.
template <int kBits, int kCode>
Status prepare_decode_kind() {
  return for_each_kernel<kBits, kCode>([](auto b, auto spb) -> Status {
    constexpr bool kB = decltype(b)::value;
    constexpr int kSpb = decltype(spb)::value;
    QMOE_CUDA_TRY(cudaFuncSetAttribute(&decode_fc_kernel<kBits, kB, kSpb, kFormRegisterRing, kCode>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kMaxDynamicSmem));
    QMOE_CUDA_TRY(cudaFuncSetAttribute(&decode_fc_kernel<kBits, kB, kSpb, kFormSharedRing, kCode>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kMaxDynamicSmem));
    for (auto* combine :
         {&decode_fc_kernel<kBits, kB, kSpb, kFormCombine, kCode>,
          &decode_fc_kernel<kBits, kB, kSpb, kFormCombine | kFormSharedRing, kCode>}) {
      QMOE_CUDA_TRY(cudaFuncSetAttribute(combine, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kMaxDynamicSmem));
      // Clusters of up to kCombineMaxSlots blocks (past 8, a size sm_90 allows on request).
      QMOE_CUDA_TRY(
          cudaFuncSetAttribute(combine, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    }
    return Status::ok();
  });
}

}  // namespace qmoe::cuda::decode_detail

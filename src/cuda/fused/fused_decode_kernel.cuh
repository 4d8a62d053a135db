// The fused decode kernel (see fused_decode.h), included once per code width by fused_b*.cu.
//
// A CTA of kFusedWarps warps, persistent: routing, then work items (FC1's, then FC2's; the grid
// barrier that orders the counters' clearing is passed once, before the CTA's first count or wait),
// then a grid barrier, then its share of the combine. Shared memory (dynamic, fused_geometry()
// sizes it):
//
//   b      [rows_cap][ld] halves    the item's B rows: FC1 the routes' input rows (ld1, zero from H),
//                                   FC2 the expert's activations (ld2, zero from I); then the K
//                                   parts' sums (red, 8 floats a lane); before the items the
//                                   routing warps' scratch, after them the combine's
//   zrow   [max(ld1, ld2)]          zeros: the B rows of absent routes
//   sc1    [kt1 * 16][nbp1]         FC1 scales of the item's tiles (fp32), zs1 likewise (zp)
//   sc2    [kt2 * 16][nbp2]         FC2 scales of the item's tiles, every block of K; zs2 likewise
//   ring   [warps][ring slots][512 B] a warp's weight chunks in flight (WarpRing), and a barrier
//   bars   [warps][ring slots][8 B]   per slot
//
// An item is kt tiles of one touched expert's FC; its warps split them: warp w takes tile w % kt
// and K part w / kt (chunks [part cpp, part cpp + cpp)), and the parts are added in part order.
// A warp's parts are one stream of 16-byte-per-lane chunks (mma_pack.h), item after item, that
// its lane 0 copies into the warp's ring with bulk asynchronous copies ahead of use, so that the
// bytes arrive while the previous item computes, the CTA stages its B rows, or, for FC2, waits
// for the expert's FC1; the decode of
// a chunk is the decode kernel's (window pairs, exact (q - zp) in bf16/f16, scales on the fp32
// sums per block).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/stamps.cuh"
#include "cuda/decode/decode_common.cuh"
#include "cuda/fused/fused_decode.h"
#include "cuda/fused/fused_launch.h"
#include "cuda/fused/fused_prologue.cuh"
#include "cuda/layer/activation.cuh"
#include "cuda/layer/stages.h"
#include "cuda/routing/route_warp.cuh"

namespace qmoe::cuda::fused_detail {

using decode_detail::acquire_load;
using decode_detail::int8_pair_bf16;
using decode_detail::kUsesWindows;
using decode_detail::mma16816;
using decode_detail::pair_of;
using decode_detail::prefetch_l2;
using decode_detail::release_add;
using decode_detail::smem_u32;
using decode_detail::window_base;
using decode_detail::window_pair;
using decode_detail::window_positions;
using decode_detail::Windows;

constexpr int kCols = 2;  // mma column groups: up to 16 routes per expert

// A warp's ring: geo.ring slots of one chunk (16 bytes per lane) in shared memory and a barrier
// per slot, which the warp's lane 0 fills with bulk asynchronous copies (bulk_copy.cuh) while
// the warp decodes the slots before them. Every stream leaves it empty; what carries from one
// stream to the next is where the next read is and its barrier's parity.
//
//   slot:  0      1      2     ...  n-1         chunk j of a stream: slot (head0 + j) % n
//          [512 B][512 B][512 B]    [512 B]     bars[k]: 8 bytes, one phase per use of slot k
struct WarpRing {
  uint32_t slots = 0;  // slot 0's shared-memory address
  uint32_t bars = 0;   // barrier 0's
  int n = 0;
  int head = 0;        // the slot the next chunk is read from
  uint32_t phase = 0;  // its barrier's parity then
};

// The call's items: FC1's [0, n1), then FC2's [n1, n); CTA c takes c, c + G, ... in order.
struct ItemList {
  int n1 = 0, n = 0;
};

// A warp's part of an item: kt tiles of one touched expert's FC, the warp taking tile tl = w % kt
// (tile0 + tl) and K part w / kt, chunks [c0, c0 + nc) (nc 0 where the item has fewer tiles).
struct Part {
  bool fc1 = true;
  int u = 0, grp = 0;  // touched expert, tile group
  int kt = 1, tl = 0, part = 0, tile0 = 0, ntl = 0, c0 = 0, nc = 0;
  const uint32_t* w = nullptr;  // chunk c0 of the warp's tile
};

__device__ __forceinline__ Part part_of(const FusedDecodeArgs& a, const FusedGeometry& geo,
                                        const Maps& m, const ItemList& il, int item, int warp) {
  Part q;
  q.fc1 = item < il.n1;
  const int it = q.fc1 ? item : item - il.n1;
  const int per = q.fc1 ? geo.items1 : geo.items2;
  q.u = it / per;
  q.grp = it - q.u * per;
  const FusedFc& f = q.fc1 ? a.fc1 : a.fc2;
  const MmaPackShape& s = f.shape;
  q.kt = q.fc1 ? geo.kt1 : geo.kt2;
  q.tl = warp % q.kt;
  q.part = warp / q.kt;
  q.tile0 = q.grp * q.kt;
  q.ntl = min(q.kt, static_cast<int>(s.tiles) - q.tile0);
  const int chunks = static_cast<int>(s.chunks);
  const int cpp = q.fc1 ? geo.cpp1 : geo.cpp2;
  q.c0 = q.part * cpp;
  q.nc = q.tl < q.ntl ? max(0, min(cpp, chunks - q.c0)) : 0;
  const int we = m.touched[q.u] - a.first_expert;
  q.w = f.packed + we * s.words_per_expert() +
        (static_cast<int64_t>(q.tile0 + q.tl) * chunks + q.c0) * 128;
  return q;
}

// The scales (and zero points) an item stages, brought into L2 ahead of it: a CTA calls this for
// its next item as the current one starts, so that the next staging reads L2, not DRAM.
__device__ __forceinline__ void prefetch_item_scales(const FusedDecodeArgs& a,
                                                     const FusedGeometry& geo, const Maps& m,
                                                     const ItemList& il, int item) {
  if (item >= il.n) return;
  const Part q = part_of(a, geo, m, il, item, 0);
  const FusedFc& f = q.fc1 ? a.fc1 : a.fc2;
  const int nbp = q.fc1 ? geo.nbp1 : geo.nbp2;
  const int64_t we = m.touched[q.u] - a.first_expert;
  const int64_t first = (we * f.shape.tiles + q.tile0) * 16 * nbp, n = q.ntl * 16 * nbp;
  const int64_t size = f.scale_dtype == DType::kF32 ? 4 : 2;
  const char* sp = reinterpret_cast<const char*>(f.scales) + first * size;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t lines = (n * size + 127) / 128;
  for (int64_t i = tid; i < lines; i += kThreads) prefetch_l2(sp + i * 128);
  if (f.zero_points != nullptr) {
    for (int64_t i = tid; i < (n + 127) / 128; i += kThreads) {
      prefetch_l2(f.zero_points + first + i * 128);
    }
  }
}

// A warp's feed: the chunks of its parts of the CTA's items, item after item, so that its ring
// stays full across items (the next item's weights arrive while this one computes). p is the next
// chunk to copy, into slot tail; left the chunks of item's part still to copy (0: the end).
struct ChunkFeed {
  const uint32_t* p = nullptr;
  int left = 0;
  int item = 0;
  int tail = 0;
};

// The feed moves to the warp's first part with chunks from `item` on (once per part, outside the
// chunk loop's common path; inlined, so that the feed stays in registers).
__device__ __forceinline__ void feed_seek(const FusedDecodeArgs& a, const FusedGeometry& geo,
                                          const Maps& m, const ItemList& il, int item, int warp,
                                          ChunkFeed& f) {
  for (; item < il.n; item += static_cast<int>(gridDim.x)) {
    const Part q = part_of(a, geo, m, il, item, warp);
    if (q.nc > 0) {
      f.item = item;
      f.p = q.w;
      f.left = q.nc;
      return;
    }
  }
  f.item = il.n;
  f.left = 0;
}

// Lane 0 copies the feed's next chunk into slot tail; every lane moves the feed on.
__device__ __forceinline__ void feed_next(const WarpRing& r, ChunkFeed& f, int lane,
                                          const FusedDecodeArgs& a, const FusedGeometry& geo,
                                          const Maps& m, const ItemList& il, int warp) {
  if (lane == 0) {
    const uint32_t bar = r.bars + kBarrierBytes * static_cast<uint32_t>(f.tail);
    mbarrier_arrive_expect_tx(bar, kChunkBytes);
    bulk_copy_g2s(r.slots + kChunkBytes * static_cast<uint32_t>(f.tail), f.p, kChunkBytes, bar);
  }
  f.p += 128;
  if (++f.tail == r.n) f.tail = 0;
  if (--f.left == 0) feed_seek(a, geo, m, il, f.item + static_cast<int>(gridDim.x), warp, f);
}

// One warp's part of its tile (chunks [c0, c0 + nc), the next nc chunks of its ring), read from
// the ring, into acc in the mma's C layout (acc[ch]: rows g, g + 8 of columns 8 ch + 2 t, + 1).
//   sc/zs: the tile's staged scales (row r's blocks at r * nbs), from the block of chunk c0 on;
//   x[ch]: the lane's B row of column group ch at chunk c0 (+ 4 t added here); nch: the groups
//   with routes.
template <int kBits, bool kBf16, int kSpb>
__device__ __forceinline__ void warp_dot(WarpRing& ring, ChunkFeed& feed,
                                         const FusedDecodeArgs& a, const FusedGeometry& geo,
                                         const Maps& m, const ItemList& il, int nc,
                                         const float* sc, const float* zs, int nbs, int c0,
                                         int cpb, const uint16_t* const x[kCols], int nch,
                                         float (&acc)[kCols][4]) {
  constexpr int kSteps = 16 / kBits;
  constexpr int kPairsPerWord = 16 / kBits;
  // int4 and int8 chunks are step-major (mma_pack.h): K in its natural order, so lane t's B
  // values are k + 2 t + {0, 1} and k + 2 t + {8, 9} (two 4-byte loads), its words a K step apart
  // in the chunk, its codes' top bits flipped.
  constexpr bool kStepMajor = mma_step_major(MmaCodes::kInt, kBits);
  constexpr int kChunkK = 16 * kSteps;
  const int lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, t4 = lane & 3;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
#pragma unroll
  for (int ch = 0; ch < kCols; ++ch) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[ch][i] = 0.0f;
  }
  const int total = nc;
  if (total == 0) return;

  const bool has_zp = zs != nullptr;
  constexpr int kNPos = window_positions<kBits, kBf16>();
  const float mid = static_cast<float>(1 << (kBits - 1));
  float s0 = 0.0f, s1 = 0.0f, z0 = mid, z1 = mid;
  uint32_t subs0[kNPos], subs1[kNPos];
  auto set_subs = [&]() {
#pragma unroll
    for (int i = 0; i < kNPos; ++i) {
      subs0[i] = pair_of<kBf16>(window_base<kBits, kBf16>(i) + z0);
      subs1[i] = pair_of<kBf16>(window_base<kBits, kBf16>(i) + z1);
    }
  };
  set_subs();
  float blk[kCols][4];
#pragma unroll
  for (int ch = 0; ch < kCols; ++ch) {
#pragma unroll
    for (int i = 0; i < 4; ++i) blk[ch][i] = 0.0f;
  }
  auto flush = [&]() {
#pragma unroll
    for (int ch = 0; ch < kCols; ++ch) {
      acc[ch][0] = fmaf(s0, blk[ch][0], acc[ch][0]);
      acc[ch][1] = fmaf(s0, blk[ch][1], acc[ch][1]);
      acc[ch][2] = fmaf(s1, blk[ch][2], acc[ch][2]);
      acc[ch][3] = fmaf(s1, blk[ch][3], acc[ch][3]);
#pragma unroll
      for (int i = 0; i < 4; ++i) blk[ch][i] = 0.0f;
    }
  };
  const float* srow = sc + g * nbs;  // row g's entries
  const float* zrow_s = has_zp ? zs + g * nbs : nullptr;
  const int nbs8 = 8 * nbs;
  auto load_scale = [&](int b) {
    s0 = srow[b];
    s1 = srow[b + nbs8];
    if (has_zp) {
      z0 = zrow_s[b];
      z1 = zrow_s[b + nbs8];
      set_subs();
    }
  };
  const uint16_t* xa[kCols];
#pragma unroll
  for (int ch = 0; ch < kCols; ++ch) xa[ch] = x[ch] + (kStepMajor ? 2 : 4) * t4;
  int left = kSpb == 0 ? cpb - c0 % cpb : 0;  // chunks to the block's end
  int bl = 0;                                 // the current block (from c0's)
  load_scale(0);

  auto process = [&](const uint4& wv, bool first_chunk) {
    const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
    if constexpr (kSpb == 0) {  // a block that starts with this chunk: the last one's sums out
      if (left == 0) {
        flush();
        load_scale(++bl);
        left = cpb;
      }
      --left;
    }
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      if constexpr (kSpb > 0) {
        if (st % kSpb == 0 && !(st == 0 && first_chunk)) {
          flush();
          load_scale(++bl);
        }
      }
      uint32_t af[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int pair = 4 * st + j;
        const uint32_t word = w[pair / kPairsPerWord];
        const int jj = pair % kPairsPerWord;
        if constexpr (kUsesWindows<kBits, kBf16>) {
          const int i = Windows<kBits, kBf16>::position_index(jj);
          af[j] = window_pair<kBits, kBf16, kStepMajor>(word, jj, (j & 1) ? subs1[i] : subs0[i]);
        } else {  // int8 with bf16 (step-major)
          af[j] = int8_pair_bf16(word, jj, (j & 1) ? subs1[0] : subs0[0]);
        }
      }
#pragma unroll
      for (int ch = 0; ch < kCols; ++ch) {
        if (ch < nch) {
          uint2 bv;
          if constexpr (kStepMajor) {
            bv.x = *reinterpret_cast<const uint32_t*>(xa[ch] + 16 * st);
            bv.y = *reinterpret_cast<const uint32_t*>(xa[ch] + 16 * st + 8);
          } else {
            bv = *reinterpret_cast<const uint2*>(xa[ch] + 16 * st);
          }
          mma16816<kBf16>(blk[ch], af, bv.x, bv.y);
        }
      }
    }
  };

  // Chunk j: wait for its slot, read the lane's 16 bytes, decode them; then, every lane's read
  // done, the slot takes the feed's next chunk (this part's, or a later item's).
  for (int j = 0; j < total; ++j) {
    const uint32_t k = static_cast<uint32_t>(ring.head);
    mbarrier_wait(ring.bars + kBarrierBytes * k, ring.phase);
    const uint32_t slot = ring.slots + kChunkBytes * k;
    uint4 v;
    if constexpr (kStepMajor) {
      v = decode_detail::lds_step_major<kBits>(slot + (kBits / 4) * 4u * lane);
    } else {
      v = decode_detail::lds128(slot + 16u * lane);
    }
    process(v, j == 0);
#pragma unroll
    for (int ch = 0; ch < kCols; ++ch) xa[ch] += kChunkK;
    __syncwarp();
    if (feed.left > 0) feed_next(ring, feed, lane, a, geo, m, il, warp);
    if (++ring.head == ring.n) {
      ring.head = 0;
      ring.phase ^= 1u;
    }
  }
  flush();
}

// The lane's B rows for an FC: route 8 ch + g's row of `base` (stride ld) below cnt, else the zero
// row (an mma column without a route).
__device__ __forceinline__ void lane_rows(const uint16_t* base, int ld, int cnt,
                                          const uint16_t* zrow, int g,
                                          const uint16_t* (&x)[kCols]) {
#pragma unroll
  for (int ch = 0; ch < kCols; ++ch) {
    const int r = 8 * ch + g;
    x[ch] = r < cnt ? base + r * ld : zrow;
  }
}

// Calls f(r, row_g, row_g8) for each route column r < cnt of a tile's sums the lane holds (the
// mma's C layout: columns 8 ch + 2 t + rr, rows g and g + 8).
template <typename F>
__device__ __forceinline__ void for_lane_routes(const float (&acc)[kCols][4], int cnt, int t4,
                                                const F& f) {
#pragma unroll
  for (int ch = 0; ch < kCols; ++ch) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = 8 * ch + 2 * t4 + rr;
      if (r < cnt) f(r, acc[ch][rr], acc[ch][2 + rr]);
    }
  }
}

// The combine, after every partial sum is written. A unit is one token's 32 columns: lane c
// takes column c, warp w the token's slots w, w + kFusedWarps, ...; each slot's value (its FC2
// sum, the bias, the routing weight) waits in shared memory, and warp 0 adds the slots in order,
// as the finalize kernel does (combine.cuh). Local experts: other shards' slots are skipped.
static __device__ __noinline__ void combine(const FusedDecodeArgs& a, const Maps& m, float* red) {
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int groups = static_cast<int>((a.hidden + 31) / 32);
  for (int unit = static_cast<int>(blockIdx.x); unit < a.tokens * groups;
       unit += static_cast<int>(gridDim.x)) {
    const int tk = unit / groups;
    const int64_t c = static_cast<int64_t>(unit - tk * groups) * 32 + lane;
    const bool col = c < a.hidden;
    for (int j = warp; j < a.slots; j += kFusedWarps) {
      const int r = tk * a.slots + j;
      if (!holds_expert(a, m.ids[r])) continue;  // another shard's: no partial sums, skipped
      float y = __ldcg(a.partial + static_cast<int64_t>(r) * a.hidden + (col ? c : 0));
      if (a.fc2.bias && col) {
        y = y + load_scalar(a.fc2.bias, a.fc2.bias_dtype,
                            static_cast<int64_t>(m.ids[r] - a.first_expert) * a.hidden + c);
      }
      red[j * 32 + lane] = a.scale_input ? y : m.weights[r] * y;
    }
    __syncthreads();
    if (warp == 0 && col) {
      float sum = 0.0f;
      for (int j = 0; j < a.slots; ++j) {
        if (holds_expert(a, m.ids[tk * a.slots + j])) sum = sum + red[j * 32 + lane];
      }
      store_float(a.out, a.out_dtype, static_cast<int64_t>(tk) * a.hidden + c, sum);
    }
    __syncthreads();
  }
}

// The routes' input rows (FC1's B) into bs: row r is route off + r's token's, zero from H to the
// row's end (ld halves); a non-finite input is recorded by the items of tile group 0.
template <bool kBf16>
__device__ __forceinline__ void stage_inputs(const FusedDecodeArgs& a, const Maps& m, int off,
                                             int cnt, int ld, bool check, uint16_t* bs) {
  constexpr int kBatch = 4;
  const int pieces = ld / 8, real = static_cast<int>(a.hidden) / 8;
  const int n = cnt * pieces;
  for (int base = static_cast<int>(threadIdx.x); base < n; base += kThreads * kBatch) {
    uint4 v[kBatch];
    int tok[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      const int r = i / pieces, p = i - r * pieces;
      tok[u] = i < n ? m.perm[off + r] / a.slots : 0;
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) +
                                                        static_cast<int64_t>(tok[u]) * a.hidden);
      v[u] = i < n && p < real ? __ldg(src + p) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      if (i >= n) continue;
      const int r = i / pieces, p = i - r * pieces;
      if (check && a.error != nullptr && nonfinite16x8(v[u], kBf16)) {
        atomicOr(a.error, kErrorInput);
        atomicMin(a.error + 1, tok[u]);
      }
      reinterpret_cast<uint4*>(bs + r * ld)[p] = v[u];
    }
  }
}

// The expert's activations (FC2's B) from the workspace into bs: rows off + r of acts (I halves
// each, I a multiple of 16), zero from I to the row's end (ld halves). L2 reads (__ldcg): FC1
// wrote them during this kernel.
__device__ __forceinline__ void stage_acts(const FusedDecodeArgs& a, const FusedGeometry& geo,
                                           int off, int cnt, uint16_t* bs) {
  constexpr int kBatch = 4;
  const int ld = geo.ld2, pieces = ld / 8, real = static_cast<int>(a.inter) / 8;
  const uint4* src = reinterpret_cast<const uint4*>(a.acts + static_cast<int64_t>(off) * a.inter);
  const int n = cnt * pieces;
  for (int base = static_cast<int>(threadIdx.x); base < n; base += kThreads * kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      const int r = i / pieces, p = i - r * pieces;
      v[u] = i < n && p < real ? __ldcg(src + r * real + p) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      if (i < n) reinterpret_cast<uint4*>(bs + (i / pieces) * ld)[i % pieces] = v[u];
    }
  }
}

template <int kBits, bool kBf16, int kSpb>
__global__ void __launch_bounds__(kThreads, 2)
    fused_decode_kernel(const __grid_constant__ FusedDecodeArgs a,
                        const __grid_constant__ FusedGeometry geo) {
  constexpr int kSteps = 16 / kBits;
  constexpr int kChunkK = 16 * kSteps;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Maps m;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  uint16_t* bs = reinterpret_cast<uint16_t*>(smem + geo.off_b);
  float* red = reinterpret_cast<float*>(smem + geo.off_b);  // after the B rows' last reader
  uint16_t* zrow = reinterpret_cast<uint16_t*>(smem + geo.off_zrow);
  float* sc1 = reinterpret_cast<float*>(smem + geo.off_sc1);
  float* zs1 = reinterpret_cast<float*>(smem + geo.off_zs1);
  float* sc2 = reinterpret_cast<float*>(smem + geo.off_sc2);
  float* zs2 = reinterpret_cast<float*>(smem + geo.off_zs2);
  const bool zp1 = a.fc1.zero_points != nullptr, zp2 = a.fc2.zero_points != nullptr;
  const MmaPackShape& s1 = a.fc1.shape;
  const DType act_dtype = kBf16 ? DType::kBF16 : DType::kF16;
  auto grid = cooperative_groups::this_grid();

  // Profiling (a.stamps): thread 0's %globaltimer, instants and summed phase durations.
  unsigned long long* st = a.stamps != nullptr && tid == 0
                               ? a.stamps + static_cast<size_t>(blockIdx.x) * kFusedStamps
                               : nullptr;
  unsigned long long mark = 0;
  auto at = [&](int i) {
    if (st != nullptr) st[i] = mark = globaltimer_ns();
  };
  auto add = [&](int i) {  // the time since the last stamp, to slot i
    if (st != nullptr) {
      const unsigned long long t = globaltimer_ns();
      st[i] += t - mark;
      mark = t;
    }
  };
  if (st != nullptr) st[kStampFc1Ns] = st[kStampFc2Ns] = 0;
  at(kStampStart);
  route_all(a, reinterpret_cast<float*>(smem + geo.off_b), m);
  at(kStampRouted);
  for (int i = tid; i < geo.zrow_len / 8; i += kThreads) {
    reinterpret_cast<uint4*>(zrow)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  // The warp's ring and its barriers (only this warp uses them).
  WarpRing ring;
  ring.n = geo.ring;
  ring.slots = smem_u32(smem + geo.off_ring) + kChunkBytes * static_cast<uint32_t>(warp * geo.ring);
  ring.bars =
      smem_u32(smem + geo.off_bars) + kBarrierBytes * static_cast<uint32_t>(warp * geo.ring);
  if (lane == 0) {
    for (int i = 0; i < ring.n; ++i) mbarrier_init1(ring.bars + kBarrierBytes * i);
    mbarrier_init_fence();
  }
  __syncwarp();

  // The counters start at zero: CTA 0 clears them before the grid barrier, and every CTA passes
  // that barrier before its first count (an FC1 item's end) or wait (an FC2 item's), so a CTA
  // reaches it without waiting on any other: no deadlock, the grid being co-resident.
  const int n_touched = m.n_touched;
  if (blockIdx.x == 0) {
    for (int i = tid; i < n_touched; i += kThreads) a.ready[i] = 0;
  }
  bool synced = false;
  auto first_sync = [&]() {
    if (!synced) {
      grid.sync();
      synced = true;
    }
  };

  ItemList il;
  il.n1 = n_touched * geo.items1;
  il.n = il.n1 + n_touched * geo.items2;
  const int gated = s1.map != MmaRowMap::kIdentity;
  const int64_t fc1_rows = gated ? 2 * s1.units : s1.n;

  // The warp's feed opens on its first part and fills the ring: the copies overlap the grid's
  // first barrier and the first item's staging.
  ChunkFeed feed;
  feed.tail = ring.head;
  feed_seek(a, geo, m, il, static_cast<int>(blockIdx.x), warp, feed);
  for (int i = 0; i < ring.n && feed.left > 0; ++i) feed_next(ring, feed, lane, a, geo, m, il, warp);

  // Items: FC1's first, then FC2's. An FC2 item waits only for FC1 items, which come before every
  // FC2 item in each CTA's order, so every FC1 item runs.
  for (int item = static_cast<int>(blockIdx.x); item < il.n;
       item += static_cast<int>(gridDim.x)) {
    const Part q = part_of(a, geo, m, il, item, warp);
    const bool fc1 = q.fc1;
    const int u = q.u, grp = q.grp;
    const int e = m.touched[u];         // router index: the maps
    const int we = e - a.first_expert;  // index in the weight tensors
    const int off = m.offset[e];
    const int cnt = __popcll(m.mask[e]);
    const int nch = (cnt + 7) / 8;
    const FusedFc& f = fc1 ? a.fc1 : a.fc2;
    const MmaPackShape& s = f.shape;
    const int kt = q.kt, tl = q.tl, part = q.part, tile0 = q.tile0, ntl = q.ntl;
    const int tile = tile0 + tl, c0 = q.c0;
    prefetch_item_scales(a, geo, m, il, item + static_cast<int>(gridDim.x));
    __syncthreads();  // the previous item's readers of the B rows, partials and scales are done

    // 1. Stage: the tiles' scales (every block of K), then FC1's input rows, or, once the expert's
    //    FC1 is complete, FC2's activations.
    if (st != nullptr) mark = globaltimer_ns();
    const int nbp = fc1 ? geo.nbp1 : geo.nbp2;
    float* sc = fc1 ? sc1 : sc2;
    float* zs = fc1 ? zs1 : zs2;
    {
      const int64_t first = (we * s.tiles + tile0) * 16 * nbp;
      stage_scales(f, ntl * 16 * nbp, sc, zs, [&](int i) { return first + i; });
    }
    if (fc1) {
      stage_inputs<kBf16>(a, m, off, cnt, geo.ld1, grp == 0, bs);
    } else {
      first_sync();
      if (tid == 0) {
        while (acquire_load(a.ready + u) < geo.items1) __nanosleep(32);
      }
      __syncthreads();
      stage_acts(a, geo, off, cnt, bs);
    }
    __syncthreads();

    // 2. The warp's part of its tile, then the parts summed in order (part 0 + 1 + ...).
    const int ld = fc1 ? geo.ld1 : geo.ld2;
    const uint16_t* x[kCols];
    lane_rows(bs, ld, cnt, zrow, g, x);
#pragma unroll
    for (int ch = 0; ch < kCols; ++ch) x[ch] += c0 * kChunkK;
    const int cpb = fc1 ? geo.cpb1 : geo.cpb2;
    const int b0 = kSpb == 0 ? c0 / cpb : c0 * kSteps / max(kSpb, 1);  // chunk c0's block
    const bool zp = fc1 ? zp1 : zp2;
    float acc[kCols][4];
    warp_dot<kBits, kBf16, kSpb>(ring, feed, a, geo, m, il, q.nc, sc + tl * 16 * nbp + b0,
                                 zp ? zs + tl * 16 * nbp + b0 : nullptr, nbp, c0, cpb, x, nch,
                                 acc);
    if (kt < kFusedWarps) {
      __syncthreads();  // every B row read: the partials take their place
      float* mine = red + (warp * 32 + lane) * 8;
#pragma unroll
      for (int ch = 0; ch < kCols; ++ch) {
#pragma unroll
        for (int i = 0; i < 4; ++i) mine[ch * 4 + i] = acc[ch][i];
      }
      __syncthreads();
      if (part == 0) {
        for (int p = 1; p < kFusedWarps / kt; ++p) {
          const float* other = red + ((p * kt + tl) * 32 + lane) * 8;
#pragma unroll
          for (int ch = 0; ch < kCols; ++ch) {
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[ch][i] = acc[ch][i] + other[ch * 4 + i];
          }
        }
      }
    }

    // 3. The epilogue: FC1's activations into the workspace (the bias, the routing weight where
    //    the input is scaled), FC2's sums into the partial sums by route id.
    if (part == 0 && tl < ntl) {
      const int64_t lr0 = s.logical_row(static_cast<int64_t>(tile) * 16 + g);
      const int64_t lr1 = s.logical_row(static_cast<int64_t>(tile) * 16 + g + 8);
      if (fc1) {
        for_lane_routes(acc, cnt, t4, [&](int r, float dot0, float dot1) {
          const float scale = a.scale_input ? m.weights[m.perm[off + r]] : 1.0f;
          auto value = [&](float dot, int64_t lr) {
            const float b =
                a.fc1.bias ? load_scalar(a.fc1.bias, a.fc1.bias_dtype, we * fc1_rows + lr) : 0.0f;
            return scale * dot + b;
          };
          uint16_t* row = a.acts + static_cast<int64_t>(off + r) * a.inter;
          if (gated) {
            if (lr0 >= 0) {
              store_float(row, act_dtype, tile * 8 + g,
                          gated_act(a.act, value(dot0, lr0), value(dot1, lr1)));
            }
          } else {
            if (lr0 >= 0) {
              store_float(row, act_dtype, tile * 16 + g, scalar_act(a.act.kind, value(dot0, lr0)));
            }
            if (lr1 >= 0) {
              store_float(row, act_dtype, tile * 16 + g + 8,
                          scalar_act(a.act.kind, value(dot1, lr1)));
            }
          }
        });
      } else {
        for_lane_routes(acc, cnt, t4, [&](int r, float dot0, float dot1) {
          float* y = a.partial + static_cast<int64_t>(m.perm[off + r]) * a.hidden;
          if (lr0 >= 0) y[lr0] = dot0;
          if (lr1 >= 0) y[lr1] = dot1;
        });
      }
    }
    if (fc1) {
      __syncthreads();  // the CTA's activation stores, then one count for the expert
      first_sync();
      if (tid == 0) release_add(a.ready + u, 1);
    }
    add(fc1 ? kStampFc1Ns : kStampFc2Ns);
  }

  // 4. Every partial sum is written: the combine.
  first_sync();
  at(kStampItemsDone);
  grid.sync();
  at(kStampSynced);
  combine(a, m, reinterpret_cast<float*>(smem + geo.off_b));
  at(kStampEnd);
}

template <int kBits, bool kBf16, int kSpb>
const void* kernel_of() {
  return reinterpret_cast<const void*>(&fused_decode_kernel<kBits, kBf16, kSpb>);
}

// The instantiations of one width: kSpb 0 (blocks of whole chunks, or per channel) and the block
// sizes shorter than a chunk (kSpb = steps per block).
template <int kBits>
const void* fused_kernel_for(bool bf16, int spb) {
  auto pick = [&](auto spb_c) -> const void* {
    constexpr int kS = decltype(spb_c)::value;
    return bf16 ? kernel_of<kBits, true, kS>() : kernel_of<kBits, false, kS>();
  };
  switch (spb) {
    case 0:
      return pick(std::integral_constant<int, 0>{});
    case 1:
      return pick(std::integral_constant<int, 1>{});
    case 2:
      if constexpr (16 / kBits >= 2) return pick(std::integral_constant<int, 2>{});
      return nullptr;
    case 4:
      if constexpr (16 / kBits >= 4) return pick(std::integral_constant<int, 4>{});
      return nullptr;
    default:
      return nullptr;
  }
}

}  // namespace qmoe::cuda::fused_detail

// The fused decode kernel (see fused_decode.h), included once per code width by fused_b*.cu.
//
// A CTA of kFusedWarps warps, persistent: routing, then work items, then grid.sync(), then its
// share of the combine. Shared memory (dynamic, fused_geometry() sizes it):
//
//   xs     [rows_cap][ld1] halves   the item's routes' input rows, zero from H to ld1 (FC1's B)
//          (before the items, the routing warps' scratch lives here: routing_warp_floats each)
//   zrow   [max(ld1, lda)]          zeros: the B rows of absent routes
//   acts   [rows_cap][lda] halves   the item's activations, units [s U, s U + U) (FC2's B)
//   sc1    [tiles1 * 16][nbp1]      FC1 scales of the item's tiles (fp32), zs1 likewise (zp)
//   sc2    [tiles2 * 16][nbs2]      FC2 scales of the slice's blocks, every row; zs2 likewise
//
//   ring   [warps][ring slots][512 B] a warp's weight chunks in flight (WarpRing), and a barrier
//   bars   [warps][ring slots][8 B]   per slot
//
// A warp's share of an FC is a stream of 16-byte-per-lane chunks (mma_pack.h): tiles first,
// first + kFusedWarps, ... and chunks [c0, c0 + nc) of each. Its lane 0 keeps the warp's ring
// full with bulk asynchronous copies, opened as soon as an item's addresses are known (FC1's
// before the item's staging, FC2's as the warp's FC1 ends), so that the bytes in flight per SM
// (two CTAs of eight warps, up to 16 chunks each) cover HBM's latency without registers; the
// decode of a chunk is the decode kernel's (window pairs, exact (q - zp) in bf16/f16, scales on the
// fp32 sums per block).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/decode/decode_common.cuh"
#include "cuda/fused/fused_decode.h"
#include "cuda/fused/fused_launch.h"
#include "cuda/layer/activation.cuh"
#include "cuda/layer/stages.h"
#include "cuda/routing/route_warp.cuh"

namespace qmoe::cuda::fused_detail {

using decode_detail::int8_pair_bf16;
using decode_detail::kUsesWindows;
using decode_detail::mma16816;
using decode_detail::pair_of;
using decode_detail::prefetch_l2;
using decode_detail::smem_u32;
using decode_detail::window_base;
using decode_detail::window_pair;
using decode_detail::window_positions;
using decode_detail::Windows;
using routing_detail::route_token_warp;

constexpr int kThreads = kFusedWarps * 32;
constexpr int kCols = 2;  // mma column groups: up to 16 routes per expert

// The call's routing, in every CTA's shared memory.
struct Maps {
  unsigned long long mask[kFusedMaxExperts];  // tokens that chose expert e
  int32_t offset[kFusedMaxExperts];           // e's first position in perm
  int32_t touched[kFusedMaxExperts];          // touched experts, ascending
  int32_t ids[kFusedMaxRoutes];               // route r = t * slots + j: its expert
  float weights[kFusedMaxRoutes];
  int32_t perm[kFusedMaxRoutes];  // expert-major, tokens ascending: route ids
  int32_t n_touched;
};

// Two CTAs per multiprocessor: their dynamic budget, their maps and the reserved share.
static_assert(2 * (kFusedSmemBudget + sizeof(Maps) + kSm90SmemReservedPerBlock) <= kSm90SmemPerSm,
              "two fused CTAs must fit a multiprocessor's shared memory");

// Whether router expert e is held here (local experts: [first_expert, first_expert + L)).
__device__ __forceinline__ bool holds_expert(const FusedDecodeArgs& a, int e) {
  return e >= a.first_expert &&
         e < a.first_expert + (a.local_experts > 0 ? a.local_experts : a.experts);
}

// Routes the call's tokens (warp w takes tokens w, w + kFusedWarps, ...) and builds the maps.
// Not inlined: one copy per translation unit, whatever the width.
static __device__ __noinline__ void route_all(const FusedDecodeArgs& a, float* scratch, Maps& m) {
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  for (int e = tid; e < a.experts; e += kThreads) m.mask[e] = 0ull;
  __syncthreads();
  routing_detail::TokenRouting r;
  r.spec = a.routing;
  r.experts = a.experts;
  r.slots = a.slots;
  r.logits = a.logits;
  r.logits_dtype = a.logits_dtype;
  r.router_weights = a.router_weights;
  r.rw_dtype = a.rw_dtype;
  r.bias = a.routing.method == RoutingMethod::kGroupedTopK ? a.router_bias : nullptr;
  r.ids = m.ids;  // shared memory, through generic addresses
  r.weights = m.weights;
  r.error = a.error;  // every CTA records the same bits: atomicOr / atomicMin are idempotent
  float* x =
      scratch + static_cast<size_t>(warp) * routing_detail::routing_warp_floats(a.experts, a.slots);
  int32_t* sids = reinterpret_cast<int32_t*>(x + 2 * a.experts);
  float* sw = x + 2 * a.experts + a.slots;
  for (int t = warp; t < a.tokens; t += kFusedWarps) {
    switch (a.routing.method) {  // the method's code only is fetched (route_warp.cuh)
      case RoutingMethod::kTopKSoftmax:
        route_token_warp<RoutingMethod::kTopKSoftmax>(r, t, x, x + a.experts, sids, sw, lane);
        break;
      case RoutingMethod::kSparseMixer:
        route_token_warp<RoutingMethod::kSparseMixer>(r, t, x, x + a.experts, sids, sw, lane);
        break;
      case RoutingMethod::kGroupedTopK:
        route_token_warp<RoutingMethod::kGroupedTopK>(r, t, x, x + a.experts, sids, sw, lane);
        break;
      case RoutingMethod::kTopKSigmoid:
        route_token_warp<RoutingMethod::kTopKSigmoid>(r, t, x, x + a.experts, sids, sw, lane);
        break;
      default:
        route_token_warp<RoutingMethod::kSoftmaxTopK>(r, t, x, x + a.experts, sids, sw, lane);
        break;
    }
    for (int j = lane; j < a.slots; j += 32) atomicOr(&m.mask[sids[j]], 1ull << t);
    __syncwarp();
  }
  __syncthreads();
  // Local experts: the touched list holds the held experts only (by their router index); the
  // offsets and perm cover every expert's routes.
  if (warp == 0) {  // touched list and offsets: one pass over E, 32 experts a step
    int nt = 0, base = 0;
    for (int e0 = 0; e0 < a.experts; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < a.experts ? __popcll(m.mask[e]) : 0;
      const bool held = holds_expert(a, e);
      const unsigned flags = __ballot_sync(0xFFFFFFFFu, c > 0 && held);
      int inc = c;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const int y = __shfl_up_sync(0xFFFFFFFFu, inc, o);
        if (lane >= o) inc += y;
      }
      if (c > 0) {
        if (held) m.touched[nt + __popc(flags & ((1u << lane) - 1u))] = e;
        m.offset[e] = base + inc - c;
      }
      nt += __popc(flags);
      base += __shfl_sync(0xFFFFFFFFu, inc, 31);
    }
    if (lane == 0) m.n_touched = nt;
  }
  __syncthreads();
  for (int r2 = tid; r2 < a.tokens * a.slots; r2 += kThreads) {
    const int t = r2 / a.slots;
    const int e = m.ids[r2];
    const unsigned long long earlier = t == 0 ? 0ull : (~0ull >> (64 - t));
    m.perm[m.offset[e] + __popcll(m.mask[e] & earlier)] = r2;
  }
  __syncthreads();
}

// Entries of a tile-ordered scale array (and its zero points) into shared memory as fp32: entry i
// of the run comes from src_of(i) (negative: none, 0 is staged), kBatch loads in flight per
// thread, the dtype's switch outside the loop.
template <typename T, typename Src>
__device__ __forceinline__ void stage_run(const T* scales, float (*cvt)(T), const uint8_t* zp,
                                          int n, float* sc, float* zs, const Src& src_of) {
  constexpr int kBatch = 8;
  for (int base = static_cast<int>(threadIdx.x); base < n; base += kThreads * kBatch) {
    float v[kBatch], z[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      const int64_t src = i < n ? src_of(i) : -1;
      v[u] = src >= 0 ? cvt(__ldg(scales + src)) : 0.0f;
      z[u] = zp != nullptr && src >= 0 ? static_cast<float>(__ldg(zp + src)) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      if (i < n) {
        sc[i] = v[u];
        if (zp != nullptr) zs[i] = z[u];
      }
    }
  }
}

__device__ __forceinline__ float f32_of(float v) { return v; }
__device__ __forceinline__ float bf16_of(uint16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v) << 16);
}
__device__ __forceinline__ float f16_of(uint16_t v) { return __half2float(__ushort_as_half(v)); }

template <typename Src>
__device__ __forceinline__ void stage_scales(const FusedFc& f, int n, float* sc, float* zs,
                                             const Src& src_of) {
  const uint8_t* zp = f.zero_points;
  switch (f.scale_dtype) {
    case DType::kF32:
      stage_run(reinterpret_cast<const float*>(f.scales), f32_of, zp, n, sc, zs, src_of);
      break;
    case DType::kBF16:
      stage_run(reinterpret_cast<const uint16_t*>(f.scales), bf16_of, zp, n, sc, zs, src_of);
      break;
    default:
      stage_run(reinterpret_cast<const uint16_t*>(f.scales), f16_of, zp, n, sc, zs, src_of);
      break;
  }
}

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

// Where one FC's stream of a warp comes from: tiles first, first + kFusedWarps, ... below
// tile_end, chunks [c0, c0 + nc) of each (chunks per tile: `chunks`); p is the next chunk to
// copy, into slot tail.
struct ChunkFeed {
  const uint32_t* p = nullptr;
  int64_t jump = 0;       // words from a tile's last chunk to the next tile's first
  int first = 0, c0 = 0;  // the stream's first tile, and its chunks' first in each tile
  int nc = 0, left = 0;
  int total = 0, issued = 0;
  int tail = 0;
};

// Lane 0 copies the feed's next chunk into slot tail; every lane moves the feed on.
__device__ __forceinline__ void feed_next(const WarpRing& r, ChunkFeed& f, int lane) {
  if (lane == 0) {
    const uint32_t bar = r.bars + kBarrierBytes * static_cast<uint32_t>(f.tail);
    mbarrier_arrive_expect_tx(bar, kChunkBytes);
    bulk_copy_g2s(r.slots + kChunkBytes * static_cast<uint32_t>(f.tail), f.p, kChunkBytes, bar);
  }
  f.p += 128;
  if (--f.left == 0) {
    f.p += f.jump;
    f.left = f.nc;
  }
  ++f.issued;
  if (++f.tail == r.n) f.tail = 0;
}

// Opens a warp's stream (see ChunkFeed) and puts its first chunks, up to a ring's worth, in
// flight: called as early as the addresses are known, so that the copies overlap whatever the
// CTA does before the stream is read.
__device__ __forceinline__ ChunkFeed begin_stream(const WarpRing& r, const uint32_t* w0, int chunks,
                                                  int first, int tile_end, int c0, int nc) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  ChunkFeed f;
  const int ntiles = first < tile_end ? (tile_end - first + kFusedWarps - 1) / kFusedWarps : 0;
  f.total = ntiles * nc;
  f.p = w0 + (static_cast<int64_t>(first) * chunks + c0) * 128;
  f.jump = (static_cast<int64_t>(kFusedWarps) * chunks - nc) * 128;
  f.first = first;
  f.c0 = c0;
  f.nc = f.left = nc;
  f.tail = r.head;
  const int n0 = min(r.n, f.total);
  for (int i = 0; i < n0; ++i) feed_next(r, f, lane);
  return f;
}

// One warp's stream over an FC's tiles, read from its ring (begin_stream opened it). For each
// finished tile, done(tile, acc) gets the sums in the mma's C layout (acc[ch]: rows g, g + 8 of
// columns 8 ch + 2 t, + 1).
//   the feed's tiles (first, first + kFusedWarps, ...), chunks [c0, c0 + nc) of each.
//   sc/zs: the scales staged for tile index tile - tile_base, nbs blocks per row, the first for
//   chunk c0. x[ch]: lane's B row of column group ch at chunk c0 (+ 4 t added here); nch: the
//   groups with routes.
template <int kBits, bool kBf16, int kSpb, typename Done>
__device__ __forceinline__ void warp_stream(WarpRing& ring, ChunkFeed& feed, int tile_base,
                                            const float* sc, const float* zs, int nbs, int cpb,
                                            const uint16_t* const x[kCols], int nch,
                                            const Done& done) {
  constexpr int kSteps = 16 / kBits;
  constexpr int kPairsPerWord = 16 / kBits;
  constexpr int kChunkK = 16 * kSteps;
  const int lane = static_cast<int>(threadIdx.x) & 31, g = lane >> 2, t4 = lane & 3;
  const int total = feed.total;
  if (total == 0) return;
  const int first = feed.first, c0 = feed.c0, nc = feed.nc;

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
  float acc[kCols][4], blk[kCols][4];
#pragma unroll
  for (int ch = 0; ch < kCols; ++ch) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[ch][i] = blk[ch][i] = 0.0f;
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
  int tile = first;
  const float* srow = sc + ((tile - tile_base) * 16 + g) * nbs;  // row g's entries
  const float* zrow_s = has_zp ? zs + ((tile - tile_base) * 16 + g) * nbs : nullptr;
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
  for (int ch = 0; ch < kCols; ++ch) xa[ch] = x[ch] + 4 * t4;
  int left = kSpb == 0 ? cpb - c0 % cpb : 0;  // chunks to the block's end
  int bl = 0;                                 // the current block (local)
  int cleft = nc;                             // chunks to the tile's end
  int tiles_left = total / nc;                // tiles from the current one on
  load_scale(0);

  auto process = [&](const uint4& wv) {
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
        if (st % kSpb == 0 && !(st == 0 && bl == 0 && cleft == nc)) {
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
          af[j] = window_pair<kBits, kBf16>(word, jj, (j & 1) ? subs1[i] : subs0[i]);
        } else {
          af[j] = int8_pair_bf16(word >> (kBits * jj), (j & 1) ? z1 : z0);
        }
      }
#pragma unroll
      for (int ch = 0; ch < kCols; ++ch) {
        if (ch < nch) {
          const uint2 bv = *reinterpret_cast<const uint2*>(xa[ch] + 16 * st);
          mma16816<kBf16>(blk[ch], af, bv.x, bv.y);
        }
      }
    }
  };
  // After a chunk: the B pointers move on; a scale block's or a tile's end flushes.
  auto after = [&]() {
#pragma unroll
    for (int ch = 0; ch < kCols; ++ch) xa[ch] += kChunkK;
    if (--cleft == 0) {  // the tile's end
      flush();
      done(tile, acc);
#pragma unroll
      for (int ch = 0; ch < kCols; ++ch) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[ch][i] = 0.0f;
        xa[ch] -= kChunkK * nc;
      }
      tile += kFusedWarps;
      if (--tiles_left > 0) {
        srow += kFusedWarps * 16 * nbs;
        if (has_zp) zrow_s += kFusedWarps * 16 * nbs;
        cleft = nc;
        bl = 0;
        left = kSpb == 0 ? cpb - c0 % cpb : 0;
        load_scale(0);
      }
    }
  };

  // Chunk j: wait for its slot, read the lane's 16 bytes, decode them; then, every lane's read
  // done, the slot takes chunk j + n.
  for (int j = 0; j < total; ++j) {
    const uint32_t k = static_cast<uint32_t>(ring.head);
    mbarrier_wait(ring.bars + kBarrierBytes * k, ring.phase);
    const uint4 v = decode_detail::lds128(ring.slots + kChunkBytes * k + 16u * lane);
    process(v);
    after();
    __syncwarp();
    if (feed.issued < total) feed_next(ring, feed, lane);
    if (++ring.head == ring.n) {
      ring.head = 0;
      ring.phase ^= 1u;
    }
  }
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
// takes column c, warp w the token's slots w, w + kFusedWarps, ...; each slot's value (the slices
// summed in order, the bias, the routing weight) waits in shared memory, and warp 0 adds the slots
// in order, as the finalize kernel does (combine.cuh). The slices' loads are all in flight at
// once, so a unit costs about two round trips to L2.
static __device__ __noinline__ void combine(const FusedDecodeArgs& a, const FusedGeometry& geo,
                                            const Maps& m, float* red) {
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int groups = static_cast<int>((a.hidden + 31) / 32);
  const int64_t plane = static_cast<int64_t>(a.tokens) * a.slots * a.hidden;
  for (int unit = static_cast<int>(blockIdx.x); unit < a.tokens * groups;
       unit += static_cast<int>(gridDim.x)) {
    const int tk = unit / groups;
    const int64_t c = static_cast<int64_t>(unit - tk * groups) * 32 + lane;
    const bool col = c < a.hidden;
    for (int j = warp; j < a.slots; j += kFusedWarps) {
      const int r = tk * a.slots + j;
      if (!holds_expert(a, m.ids[r])) continue;  // another shard's: no partial sums, skipped
      const float* p = a.partial + static_cast<int64_t>(r) * a.hidden + (col ? c : 0);
      float y = 0.0f;
      for (int s0 = 0; s0 < geo.slices; s0 += 8) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u)
          v[u] = s0 + u < geo.slices ? __ldcg(p + (s0 + u) * plane) : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          if (s0 + u < geo.slices) y = y + v[u];
        }
      }
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
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem + geo.off_xs);
  uint16_t* zrow = reinterpret_cast<uint16_t*>(smem + geo.off_zrow);
  uint16_t* acts = reinterpret_cast<uint16_t*>(smem + geo.off_acts);
  float* sc1 = reinterpret_cast<float*>(smem + geo.off_sc1);
  float* zs1 = reinterpret_cast<float*>(smem + geo.off_zs1);
  float* sc2 = reinterpret_cast<float*>(smem + geo.off_sc2);
  float* zs2 = reinterpret_cast<float*>(smem + geo.off_zs2);
  const bool zp1 = a.fc1.zero_points != nullptr, zp2 = a.fc2.zero_points != nullptr;
  const MmaPackShape& s1 = a.fc1.shape;
  const MmaPackShape& s2 = a.fc2.shape;
  const DType act_dtype = kBf16 ? DType::kBF16 : DType::kF16;

  // Profiling (a.stamps): thread 0's %globaltimer, instants and summed phase durations.
  unsigned long long* st = a.stamps != nullptr && tid == 0
                               ? a.stamps + static_cast<size_t>(blockIdx.x) * kFusedStamps
                               : nullptr;
  unsigned long long mark = 0;
  auto now = []() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  };
  auto at = [&](int i) {
    if (st != nullptr) st[i] = mark = now();
  };
  auto add = [&](int i) {  // the time since the last stamp, to slot i
    if (st != nullptr) {
      const unsigned long long t = now();
      st[i] += t - mark;
      mark = t;
    }
  };
  if (st != nullptr) st[kStampStageNs] = st[kStampFc1Ns] = st[kStampFc2Ns] = 0;
  at(kStampStart);
  route_all(a, reinterpret_cast<float*>(smem), m);
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

  const int routes = a.tokens * a.slots;
  const int n_items = m.n_touched * geo.slices;
  const int U = geo.units;
  const int gated = s1.map != MmaRowMap::kIdentity;
  const int upt1 = gated ? 8 : 16;
  const int64_t fc1_rows = gated ? 2 * s1.units : s1.n;

  for (int item = static_cast<int>(blockIdx.x); item < n_items;
       item += static_cast<int>(gridDim.x)) {
    const int u = item / geo.slices, s = item - u * geo.slices;
    const int e = m.touched[u];         // router index: the maps
    const int we = e - a.first_expert;  // index in the weight tensors
    const int off = m.offset[e];
    const int cnt = __popcll(m.mask[e]);
    const int j0 = s * U;
    const int m1 = j0 / upt1;
    const int m1_end = min(m1 + U / upt1, static_cast<int>(s1.tiles));
    const int c2 = j0 / kChunkK;
    const int nc2 = min(U / kChunkK, static_cast<int>(s2.chunks) - c2);
    const uint32_t* w1 = a.fc1.packed + we * s1.words_per_expert();
    const uint32_t* w2 = a.fc2.packed + we * s2.words_per_expert();
    // The warp's FC1 tiles go out first: their copies overlap the staging below.
    ChunkFeed feed = begin_stream(ring, w1, static_cast<int>(s1.chunks), m1 + warp, m1_end, 0,
                                  static_cast<int>(s1.chunks));
    __syncthreads();  // the previous item's readers of the staged rows are done

    // FC2's slice (whole chunks at a stride) comes into L2 while the item stages and runs FC1.
    for (int i = tid; i < static_cast<int>(s2.tiles) * nc2 * 4; i += kThreads) {
      const int tile = i / (nc2 * 4), line = i - tile * (nc2 * 4);
      prefetch_l2(w2 + (static_cast<int64_t>(tile) * s2.chunks + c2) * 128 + line * 32);
    }

    // 1. Stage: the routes' input rows, the activations' zeros, both FCs' scales, every load of a
    //    batch in flight at once (a CTA's item starts with these round trips).
    if (st != nullptr) mark = now();
    const int pieces = geo.ld1 / 8, real = static_cast<int>(a.hidden) / 8;
    {
      constexpr int kBatch = 4;
      const int n = cnt * pieces;
      for (int base = tid; base < n; base += kThreads * kBatch) {
        uint4 v[kBatch];
        int tok[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = base + u * kThreads;
          const int r = i / pieces, p = i - r * pieces;
          tok[u] = i < n ? m.perm[off + r] / a.slots : 0;
          const uint4* src = reinterpret_cast<const uint4*>(
              static_cast<const uint16_t*>(a.x) + static_cast<int64_t>(tok[u]) * a.hidden);
          v[u] = i < n && p < real ? __ldg(src + p) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = base + u * kThreads;
          if (i >= n) continue;
          const int r = i / pieces, p = i - r * pieces;
          if (s == 0 && a.error != nullptr && nonfinite16x8(v[u], kBf16)) {
            atomicOr(a.error, kErrorInput);
            atomicMin(a.error + 1, tok[u]);
          }
          reinterpret_cast<uint4*>(xs + r * geo.ld1)[p] = v[u];
        }
      }
    }
    for (int i = tid; i < cnt * geo.lda / 8; i += kThreads) {
      reinterpret_cast<uint4*>(acts)[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    {
      const int64_t first1 = (we * s1.tiles + m1) * 16 * geo.nbp1;
      stage_scales(a.fc1, (m1_end - m1) * 16 * geo.nbp1, sc1, zs1,
                   [&](int i) { return first1 + i; });
      // FC2: the slice's nbs2 blocks of every row, from block b2; the last slice may pass K's
      // last block (its codes there meet zero activations).
      const int nbp2 = static_cast<int>(s2.scale_blocks);
      const int b2 = s2.block_size ? j0 / s2.block_size : 0;
      const int nbs2 = geo.nbs2;
      const int64_t first2 = we * s2.tiles * 16 * nbp2 + b2;
      stage_scales(a.fc2, static_cast<int>(s2.tiles) * 16 * nbs2, sc2, zs2, [&](int i) {
        const int row = i / nbs2, b = i - row * nbs2;
        return b2 + b < nbp2 ? first2 + static_cast<int64_t>(row) * nbp2 + b : int64_t{-1};
      });
    }
    __syncthreads();
    add(kStampStageNs);

    // 2. FC1: tiles [m1, m1_end), a warp each in turn, all of K; the activation into acts.
    const uint16_t* x1[kCols];
    lane_rows(xs, geo.ld1, cnt, zrow, g, x1);
    const int nch = (cnt + 7) / 8;
    warp_stream<kBits, kBf16, kSpb>(
        ring, feed, m1, sc1, zp1 ? zs1 : nullptr, geo.nbp1, geo.cpb1, x1, nch,
        [&](int tile, const float(&acc)[kCols][4]) {
          const int64_t lr0 = s1.logical_row(static_cast<int64_t>(tile) * 16 + g);
          const int64_t lr1 = s1.logical_row(static_cast<int64_t>(tile) * 16 + g + 8);
          for_lane_routes(acc, cnt, t4, [&](int r, float dot0, float dot1) {
            const float scale = a.scale_input ? m.weights[m.perm[off + r]] : 1.0f;
            auto value = [&](float dot, int64_t lr) {
              const float b =
                  a.fc1.bias ? load_scalar(a.fc1.bias, a.fc1.bias_dtype, we * fc1_rows + lr) : 0.0f;
              return scale * dot + b;
            };
            uint16_t* row = acts + r * geo.lda;
            if (gated) {
              if (lr0 >= 0) {
                store_float(row, act_dtype, (tile - m1) * 8 + g,
                            gated_act(a.act, value(dot0, lr0), value(dot1, lr1)));
              }
            } else {
              if (lr0 >= 0) {
                store_float(row, act_dtype, (tile - m1) * 16 + g,
                            scalar_act(a.act.kind, value(dot0, lr0)));
              }
              if (lr1 >= 0) {
                store_float(row, act_dtype, (tile - m1) * 16 + g + 8,
                            scalar_act(a.act.kind, value(dot1, lr1)));
              }
            }
          });
        });
    // The warp's FC2 chunks go out while the other warps finish FC1.
    feed = begin_stream(ring, w2, static_cast<int>(s2.chunks), warp, static_cast<int>(s2.tiles), c2,
                        nc2);
    __syncthreads();
    add(kStampFc1Ns);

    // 3. FC2: every tile, chunks [c2, c2 + nc2): partial sums of the slice.
    const uint16_t* x2[kCols];
    lane_rows(acts, geo.lda, cnt, zrow, g, x2);
    float* part = a.partial + static_cast<int64_t>(s) * routes * a.hidden;
    warp_stream<kBits, kBf16, kSpb>(
        ring, feed, 0, sc2, zp2 ? zs2 : nullptr, geo.nbs2, geo.cpb2, x2, nch,
        [&](int tile, const float(&acc)[kCols][4]) {
          const int64_t lr0 = s2.logical_row(static_cast<int64_t>(tile) * 16 + g);
          const int64_t lr1 = s2.logical_row(static_cast<int64_t>(tile) * 16 + g + 8);
          for_lane_routes(acc, cnt, t4, [&](int r, float dot0, float dot1) {
            float* y = part + static_cast<int64_t>(m.perm[off + r]) * a.hidden;
            if (lr0 >= 0) y[lr0] = dot0;
            if (lr1 >= 0) y[lr1] = dot1;
          });
        });
    if (a.stamps != nullptr) {
      __syncthreads();
      add(kStampFc2Ns);
    }
  }

  // 4. Every partial sum is written: the combine.
  at(kStampItemsDone);
  cooperative_groups::this_grid().sync();
  at(kStampSynced);
  combine(a, geo, m, reinterpret_cast<float*>(smem));
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

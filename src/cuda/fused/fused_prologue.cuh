// The fused decode kernel's prologue (fused_decode_kernel.cuh): every CTA routes the call's
// tokens itself into its shared memory (Maps, route_all), and an item's scales and zero points
// are staged into shared memory as fp32 (stage_scales).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/sm90.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/fused/fused_launch.h"
#include "cuda/routing/route_warp.cuh"

namespace qmoe::cuda::fused_detail {

using routing_detail::route_token_warp;

constexpr int kThreads = kFusedWarps * 32;

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

}  // namespace qmoe::cuda::fused_detail

// Routing one token with one warp, bit for bit equal to routing::route_token() on the host.
//
// What is order-independent runs on all 32 lanes: loading and decoding the logits, the
// element-wise exp / sigmoid, the maxima and the top-k picks. ranks_before() is a strict total
// order on (value, index), so the best element under it is unique and a shuffle reduction finds
// exactly the element the host's sequential scan finds. Every floating-point SUM runs on lane 0
// alone, in the host's order (index order over experts, slot order over the k picks), and every
// operation after the selection mirrors route_token.h line by line (or calls it), so each
// rounding happens on the same operands.
//
// Requires the whole warp (all 32 lanes, warp-uniform arguments). x and work are the warp's
// 2 E floats of shared memory, sids and sw its `slots` ids and weights there: lane 0 builds the
// token's slots in shared memory (it reads them back several times, which from global memory
// would cost an L2 round trip each) and the warp writes them out once at the end.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/numeric.h"
#include "core/routing/route_token.h"
#include "cuda/routing/device_routing.h"
#include "qmoe/layer.h"
#include "qmoe/tensor.h"

namespace qmoe::cuda::routing_detail {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kWarpSize = 32;

// What the routing kernels read and write, by value in kernel parameters.
struct TokenRouting {
  RoutingSpec spec;
  int experts = 0;  // E
  int slots = 0;    // top_k + num_shared
  const void* logits = nullptr;
  DType logits_dtype = DType::kF32;
  const void* router_weights = nullptr;  // optional
  DType rw_dtype = DType::kF32;
  const float* bias = nullptr;  // kGroupedTopK only
  int32_t* ids = nullptr;       // [T * slots]
  float* weights = nullptr;     // [T * slots]
  int32_t* error = nullptr;     // int32[2]
};

inline TokenRouting token_routing(const DeviceRoutingArgs& a) {
  TokenRouting t;
  t.spec = a.routing;
  t.experts = static_cast<int>(a.num_experts);
  t.slots = a.routing.top_k + a.routing.num_shared;
  t.logits = a.logits;
  t.logits_dtype = a.logits_dtype;
  t.router_weights = a.router_weights;
  t.rw_dtype = a.rw_dtype;
  t.bias = a.routing.method == RoutingMethod::kGroupedTopK ? a.router_bias : nullptr;
  t.ids = a.maps.expert_ids;
  t.weights = a.maps.weights;
  t.error = a.error;
  return t;
}

// Element i of an f32/f16/bf16 array as fp32, decoded exactly as the host's load_row().
__device__ __forceinline__ float load_as_f32(const void* p, DType t, int64_t i) {
  if (t == DType::kF16) return num::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  if (t == DType::kBF16) return num::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

__device__ __forceinline__ bool is_finite_f32(float v) {
  return (num::f32_bits(v) & 0x7F800000u) != 0x7F800000u;
}

// A candidate (value, index); index < 0 means none, ranked below everything.
struct Pick {
  float v;
  int i;
};

__device__ __forceinline__ bool better(const Pick& a, const Pick& b, bool higher_first) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  return routing::ranks_before(a.v, a.i, b.v, b.i, higher_first);
}

// This lane's best element of v[0, n) (indices lane, lane + 32, ...) among those ranked after
// `after` (all of them when after.i < 0): one step of the host's select_top_k, on a lane's share.
// Not inlined: it is called from several places per method, and one copy keeps the kernel's code
// small (see with_routing_method).
static __device__ __noinline__ Pick lane_best(const float* v, int n, int lane, Pick after,
                                              bool higher_first) {
  Pick best{0.0f, -1};
  for (int e = lane; e < n; e += kWarpSize) {
    const float ve = v[e];
    if (after.i >= 0 && !routing::ranks_before(after.v, after.i, ve, e, higher_first)) continue;
    if (best.i < 0 || routing::ranks_before(ve, e, best.v, best.i, higher_first)) best = {ve, e};
  }
  return best;
}

// A float's bits as an unsigned key in the same order (-0 counted as +0, which compares equal to
// it); 0 is below every key of a non-NaN float, so it stands for "no candidate".
__device__ __forceinline__ unsigned order_key(float v) {
  unsigned u = num::f32_bits(v);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The best of the 32 lanes' candidates; every lane gets the same (unique) answer. Two warp
// reductions: the largest value, then among the lanes holding it the index the tie rule prefers
// (each element index belongs to lane index % 32, which holds its exact bits).
__device__ __forceinline__ Pick warp_best(Pick p, bool higher_first) {
  const unsigned key = p.i < 0 ? 0u : order_key(p.v);
  const unsigned best = __reduce_max_sync(kFullMask, key);
  if (best == 0u) return Pick{0.0f, -1};
  const unsigned i =
      higher_first
          ? __reduce_max_sync(kFullMask, key == best ? static_cast<unsigned>(p.i) : 0u)
          : __reduce_min_sync(kFullMask, key == best ? static_cast<unsigned>(p.i) : 0xFFFFFFFFu);
  const int idx = static_cast<int>(i);
  return Pick{__shfl_sync(kFullMask, p.v, idx % kWarpSize), idx};
}

// ids[0, k) = the k best of v[0, n) in rank order (lane 0 writes), like select_top_k(). Pick j
// is the best ranked after pick j - 1; a lane's own best stays valid until it is picked, so
// only the lane that owned the pick rescans its share.
__device__ __forceinline__ void warp_select_top_k(const float* v, int n, int k, bool higher_first,
                                                  int lane, int32_t* ids) {
  Pick mine = lane_best(v, n, lane, Pick{0.0f, -1}, higher_first);
  QMOE_NO_UNROLL
  for (int j = 0; j < k; ++j) {
    const Pick best = warp_best(mine, higher_first);
    if (lane == 0) ids[j] = best.i;
    if (j + 1 < k && mine.i == best.i) mine = lane_best(v, n, lane, best, higher_first);
  }
}

// x[0, n) in index order, summed by lane 0 and broadcast: the host's sequential sum.
__device__ __forceinline__ float warp_serial_sum(const float* x, int n, int lane) {
  float sum = 0.0f;
  if (lane == 0) {
    // Unrolled by 4 so that a batch's shared-memory loads go out together (the adds stay in
    // index order) without multiplying the kernel's code.
#pragma unroll 4
    for (int e = 0; e < n; ++e) sum = sum + x[e];
  }
  return __shfl_sync(kFullMask, sum, 0);
}

// ---- the methods; n = E - num_shared routed experts, x = logits, work = E floats ----

__device__ __forceinline__ void softmax_top_k_warp(const RoutingSpec& r, int n, const float* x,
                                                   float* p, int32_t* ids, float* w, int lane) {
  // The host's max keeps the first of equal maxima: the lower-index-first best has its bits.
  const float m = warp_best(lane_best(x, n, lane, Pick{0.0f, -1}, false), false).v;
  for (int e = lane; e < n; e += kWarpSize) p[e] = routing::exp_f32(x[e] - m);
  __syncwarp();
  const float sum = warp_serial_sum(p, n, lane);
  QMOE_NO_UNROLL
  for (int e = lane; e < n; e += kWarpSize) p[e] = p[e] / sum;
  __syncwarp();
  warp_select_top_k(p, n, r.top_k, r.ties == TieBreak::kHigherIndex, lane, ids);
  if (lane == 0) {
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) w[j] = p[ids[j]];
    if (r.normalize) routing::renormalize(w, r.top_k);
  }
}

__device__ __forceinline__ void top_k_softmax_warp(const RoutingSpec& r, int n, const float* x,
                                                   int32_t* ids, float* w, int lane) {
  warp_select_top_k(x, n, r.top_k, r.ties == TieBreak::kHigherIndex, lane, ids);
  if (lane == 0) {
    const float m = x[ids[0]];
    float sum = 0.0f;
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) {
      w[j] = routing::exp_f32(x[ids[j]] - m);
      sum = sum + w[j];
    }
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) w[j] = w[j] / sum;
  }
}

// Each pass writes exp(x_e - m) of the kept entries and +0 for the others into work, and lane 0
// sums them in index order: adding +0 to a sum that starts at +0 and only grows changes no bit,
// so this equals the host's sum over the kept entries alone.
__device__ __forceinline__ void sparse_mixer_warp(const RoutingSpec& r, int n, const float* x,
                                                  float* work, int32_t* ids, float* w, int lane) {
  const bool higher = r.ties == TieBreak::kHigherIndex;
  const float two_eps = 2.0f * r.sparse_mixer_eps;
  Pick mine = lane_best(x, n, lane, Pick{0.0f, -1}, higher);
  const Pick first = warp_best(mine, higher);
  if (mine.i == first.i) mine = lane_best(x, n, lane, first, higher);
  const Pick second = warp_best(mine, higher);
  if (lane == 0) {
    ids[0] = first.i;
    ids[1] = second.i;
  }
  for (int j = 0; j < 2; ++j) {
    const Pick pick = j == 0 ? first : second;
    const float m = pick.v;
    for (int e = lane; e < n; e += kWarpSize) {
      const bool skip = (j == 1 && e == first.i) || routing::sparse_mixer_masked(m, x[e], two_eps);
      work[e] = skip ? 0.0f : routing::exp_f32(x[e] - m);
    }
    __syncwarp();
    const float sum = warp_serial_sum(work, n, lane);
    if (lane == 0) w[j] = routing::exp_f32(x[pick.i] - m) / sum;
    __syncwarp();  // work is rewritten by the next pass
  }
}

// s overwrites x[0, n), c fills work[0, n). A lane owns groups lane, lane + 32, ... and scores
// them with the host's group_score(), so a group's score has the host's bits.
__device__ __forceinline__ void grouped_top_k_warp(const RoutingSpec& r, int n, float* x,
                                                   const float* bias, float* work, int32_t* ids,
                                                   float* w, int lane) {
  const bool higher = r.ties == TieBreak::kHigherIndex;
  float* s = x;
  float* c = work;
  for (int e = lane; e < n; e += kWarpSize) {
    s[e] = routing::sigmoid_f32(x[e]);
    c[e] = s[e] + bias[e];
  }
  __syncwarp();
  const int size = n / r.n_group;
  Pick last{0.0f, -1};  // the last of the topk_group best groups
  QMOE_NO_UNROLL
  for (int j = 0; j < r.topk_group; ++j) {
    Pick mine{0.0f, -1};
    for (int g = lane; g < r.n_group; g += kWarpSize) {
      const Pick cand{routing::group_score(c, g * size, size), g};
      if (last.i >= 0 && !routing::ranks_before(last.v, last.i, cand.v, g, higher)) continue;
      if (better(cand, mine, higher)) mine = cand;
    }
    last = warp_best(mine, higher);
  }
  // A lane masks only its own groups, which no other lane reads.
  for (int g = lane; g < r.n_group; g += kWarpSize) {
    if (g == last.i) continue;
    const float sg = routing::group_score(c, g * size, size);
    if (routing::ranks_before(sg, g, last.v, last.i, higher)) continue;
    for (int e = g * size; e < (g + 1) * size; ++e) c[e] = num::bits_f32(0xFF800000u);  // -inf
  }
  __syncwarp();
  warp_select_top_k(c, n, r.top_k, higher, lane, ids);
  if (lane == 0) {
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) w[j] = s[ids[j]];
    if (r.normalize) {
      float sum = 0.0f;
      QMOE_NO_UNROLL
      for (int j = 0; j < r.top_k; ++j) sum = sum + w[j];
      const float denom = sum + routing::kGroupedDenomEps;
      QMOE_NO_UNROLL
      for (int j = 0; j < r.top_k; ++j) w[j] = w[j] / denom;
    }
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) w[j] = w[j] * r.routed_scaling_factor;
  }
}

__device__ __forceinline__ void top_k_sigmoid_warp(const RoutingSpec& r, int n, const float* x,
                                                   int32_t* ids, float* w, int lane) {
  warp_select_top_k(x, n, r.top_k, r.ties == TieBreak::kHigherIndex, lane, ids);
  if (lane == 0) {
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) w[j] = routing::sigmoid_f32(x[ids[j]]);
    if (r.normalize) routing::renormalize(w, r.top_k);
  }
}

// Routes token t: ids and weights of its slots. A token with a non-finite logit or router
// weight is routed as if its logits were all zero, its weights become NaN and the error word
// records it (device_routing.h).
template <RoutingMethod kMethod>
__device__ __forceinline__ void route_token_warp(const TokenRouting& a, int64_t t, float* x,
                                                 float* work, int32_t* sids, float* sw, int lane) {
  const RoutingSpec& r = a.spec;
  const int num_e = a.experts;
  const int n = num_e - r.num_shared;
  const int64_t row = t * num_e;
  int32_t* ids = sids;
  float* w = sw;

  bool bad_logit = false;
  bool bad_weight = false;
  for (int e = lane; e < num_e; e += kWarpSize) {
    const float v = load_as_f32(a.logits, a.logits_dtype, row + e);
    bad_logit = bad_logit || !is_finite_f32(v);
    x[e] = v;
  }
  if (a.router_weights != nullptr) {
    for (int e = lane; e < num_e; e += kWarpSize) {
      bad_weight = bad_weight || !is_finite_f32(load_as_f32(a.router_weights, a.rw_dtype, row + e));
    }
  }
  bad_logit = __any_sync(kFullMask, bad_logit);
  bad_weight = __any_sync(kFullMask, bad_weight);
  const bool bad = bad_logit || bad_weight;
  if (bad) {
    for (int e = lane; e < num_e; e += kWarpSize) x[e] = 0.0f;
    if (lane == 0) {
      atomicOr(a.error, (bad_logit ? kErrorLogits : 0) | (bad_weight ? kErrorRouterWeights : 0));
      atomicMin(a.error + 1, static_cast<int32_t>(t));
    }
  }
  __syncwarp();

  if constexpr (kMethod == RoutingMethod::kSoftmaxTopK) {
    softmax_top_k_warp(r, n, x, work, ids, w, lane);
  } else if constexpr (kMethod == RoutingMethod::kTopKSoftmax) {
    top_k_softmax_warp(r, n, x, ids, w, lane);
  } else if constexpr (kMethod == RoutingMethod::kSparseMixer) {
    sparse_mixer_warp(r, n, x, work, ids, w, lane);
  } else if constexpr (kMethod == RoutingMethod::kGroupedTopK) {
    grouped_top_k_warp(r, n, x, a.bias, work, ids, w, lane);
  } else {
    static_assert(kMethod == RoutingMethod::kTopKSigmoid, "a routing method without a warp path");
    top_k_sigmoid_warp(r, n, x, ids, w, lane);
  }
  if (lane == 0) {
    // Shared experts: x[n, E) is never overwritten by the methods.
    QMOE_NO_UNROLL
    for (int i = 0; i < r.num_shared; ++i) {
      ids[r.top_k + i] = n + i;
      w[r.top_k + i] = routing::sigmoid_f32(x[n + i]);
    }
    if (a.router_weights != nullptr) {
      QMOE_NO_UNROLL
      for (int j = 0; j < r.top_k; ++j) {
        w[j] = load_as_f32(a.router_weights, a.rw_dtype, row + ids[j]);
      }
      routing::finish_gathered_weights(r, w);
    }
    if (bad) {
      QMOE_NO_UNROLL
      for (int j = 0; j < a.slots; ++j) w[j] = num::bits_f32(0x7FC00000u);  // quiet NaN
    }
  }
  __syncwarp();
  QMOE_NO_UNROLL
  for (int j = lane; j < a.slots; j += kWarpSize) {
    a.ids[t * a.slots + j] = ids[j];
    a.weights[t * a.slots + j] = w[j];
  }
}

// Calls f(std::integral_constant<RoutingMethod, M>{}) for the runtime method m. Each routing
// kernel is instantiated per method so that it holds one method's code: a decode step runs its
// routing once, with the kernel's code cold in the instruction caches, and fetching all five
// methods' code made the one-block fused kernel take ~18 us for one token.
template <typename F>
auto with_routing_method(RoutingMethod m, F&& f) {
  switch (m) {
    case RoutingMethod::kTopKSoftmax:
      return f(std::integral_constant<RoutingMethod, RoutingMethod::kTopKSoftmax>{});
    case RoutingMethod::kSparseMixer:
      return f(std::integral_constant<RoutingMethod, RoutingMethod::kSparseMixer>{});
    case RoutingMethod::kGroupedTopK:
      return f(std::integral_constant<RoutingMethod, RoutingMethod::kGroupedTopK>{});
    case RoutingMethod::kTopKSigmoid:
      return f(std::integral_constant<RoutingMethod, RoutingMethod::kTopKSigmoid>{});
    case RoutingMethod::kSoftmaxTopK:
    default:
      return f(std::integral_constant<RoutingMethod, RoutingMethod::kSoftmaxTopK>{});
  }
}

// Floats of shared memory one routing warp needs: x and work (E each), then its slots' ids and
// weights.
__host__ __device__ inline size_t routing_warp_floats(int experts, int slots) {
  return 2 * static_cast<size_t>(experts) + 2 * static_cast<size_t>(slots);
}

}  // namespace qmoe::cuda::routing_detail

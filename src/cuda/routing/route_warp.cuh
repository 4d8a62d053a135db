// Routing one token with one warp, bit for bit equal to routing::route_token() on the host.
//
// Lane l owns experts l, l + 32, l + 64, ... and does their element-wise work (decoding, exp,
// sigmoid, division by a sum). The orders the host fixes are ones a warp follows in parallel:
//   - sums over the experts run in warp order (routing::warp_order_sum()): each lane adds its own
//     experts in index order, then an xor butterfly of shuffles combines the 32 partial sums;
//   - sums over the k selected slots run in slot order: lane j computes slot j's weight, and every
//     lane adds the slots' weights, gathered by shuffles, in slot order;
//   - maxima and top-k picks are order-free: ranks_before() is a strict total order on (value,
//     index), which a 64-bit key encodes (rank_key()), so the best key under a warp reduction is
//     exactly the element the host's sequential scan finds.
// Every weight goes through the host's own helpers (slot_weight(), finish_slot_weight(), exp_f32,
// sigmoid_f32, group_score()), so each rounding happens on the same operands.
//
// Requires the whole warp (all 32 lanes, warp-uniform arguments). x and work are the warp's
// 2 E floats of shared memory (a row of values a lane owns stays there between passes: E may be
// up to 16384, more than registers hold), sids and sw its `slots` ids and weights there.
#pragma once

#include <cuda_fp16.h>
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

// Calls f(e, own) for a lane's share of items [0, n), e = lane, lane + 32, ..., kUnroll at a
// time: the shares' shared-memory loads and independent chains (exp, division) overlap, four of
// them at E = 128. Past the end of the share e is clamped to n - 1 and own is false, so f computes
// as usual and only its effect is skipped. n - 1 is another lane's item: f may read it where the
// row is read-only (the logits), but must return first where lanes write the row it reads (a
// method's shared-memory rows), or the read races with that lane's write. The loop holds kUnroll
// copies of f and no remainder copies (the code is fetched cold once per decode step; the
// compiler's own unrolling of a plain loop left up to 16 copies, or 4 plus 3 for the remainder).
template <int kUnroll = 4, typename F>
__device__ __forceinline__ void for_lane_share(int n, int lane, const F& f) {
  QMOE_NO_UNROLL
  for (int base = lane; base < n; base += kUnroll * kWarpSize) {
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) {
      const int e = base + i * kWarpSize;
      f(min(e, n - 1), e < n);
    }
  }
}

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

// The bits of element i of an f32/f16/bf16 array as loaded (16-bit types zero-extended), and
// as fp32. Equal to the host's load_row() for every finite value (f16 to f32 is exact, in
// hardware as in num::f16_to_f32); a non-finite value stays non-finite, which is all the
// non-finite rule looks at. Loading and decoding apart lets a batch of loads go out without a
// branch between them.
__device__ __forceinline__ int dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// Row `row` of a [T, E] array of type t.
__device__ __forceinline__ const void* row_of(const void* p, DType t, int64_t row, int experts) {
  return static_cast<const char*>(p) + row * experts * dtype_bytes(t);
}

__device__ __forceinline__ uint32_t load_bits(const void* p, DType t, int i) {
  const int size = dtype_bytes(t);
  const char* q = static_cast<const char*>(p) + static_cast<unsigned>(i) * size;
  return size == 4 ? __ldg(reinterpret_cast<const unsigned*>(q))
                   : __ldg(reinterpret_cast<const unsigned short*>(q));
}

__device__ __forceinline__ float decode_f32(uint32_t bits, DType t) {
  if (t == DType::kF16) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  return num::bits_f32(t == DType::kBF16 ? bits << 16 : bits);
}

__device__ __forceinline__ float load_as_f32(const void* p, DType t, int i) {
  return decode_f32(load_bits(p, t, i), t);
}

__device__ __forceinline__ bool is_finite_f32(float v) {
  return (num::f32_bits(v) & 0x7F800000u) != 0x7F800000u;
}

// Loads a lane's share of row elements [0, count) of src, storing them to dst[e] when dst is set;
// returns whether any is non-finite. Up to kLoadBatch loads per lane go out before the first is
// used, so E <= 32 kLoadBatch costs one memory round trip. The breaks are warp-uniform; a lane
// past the end loads element count - 1 again rather than branching around the load.
constexpr int kLoadBatch = 16;

__device__ __forceinline__ bool load_row(const void* src, DType t, int count, float* dst,
                                         int lane) {
  bool bad = false;
  QMOE_NO_UNROLL
  for (int base = 0; base < count; base += kWarpSize * kLoadBatch) {
    uint32_t bits[kLoadBatch];
#pragma unroll
    for (int i = 0; i < kLoadBatch; ++i) {
      if (base + i * kWarpSize >= count) break;
      bits[i] = load_bits(src, t, min(base + i * kWarpSize + lane, count - 1));
    }
#pragma unroll
    for (int i = 0; i < kLoadBatch; ++i) {
      if (base + i * kWarpSize >= count) break;
      const int e = base + i * kWarpSize + lane;
      const float v = decode_f32(bits[i], t);
      if (e < count) {
        bad = bad || !is_finite_f32(v);
        if (dst != nullptr) dst[e] = v;
      }
    }
  }
  return bad;
}

// ---- sums and maxima ----

// The warp's 32 partial sums combined as routing::warp_order_sum() combines them: at step off,
// lane l adds lane (l ^ off)'s partial to its own; every lane ends with the same bits.
__device__ __forceinline__ float warp_sum(float partial) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
    partial = partial + __shfl_xor_sync(kFullMask, partial, off);
  }
  return partial;
}

// A float's bits as an unsigned key in the same order, -0 counted as +0 (which compares equal to
// it): v + 0 turns -0 into +0 and leaves every other value as it is. Every non-NaN float has a
// key > 0, so 0 stands for "none".
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t u = num::f32_bits(v + 0.0f);
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

__device__ __forceinline__ float from_order_key(uint32_t key) {
  return num::bits_f32(key ^ ((key & 0x80000000u) ? 0x80000000u : 0xFFFFFFFFu));
}

// The largest of x[0, n), n >= 1. A maximum of zero may come back as either zero where the
// host's running max, which keeps the first of equal values, has the other. Harmless: softmax
// only uses m in x - m, which then differs only for x = -0 (-0 - +0 = -0, -0 - -0 = +0), and
// exp_f32 maps both zeros to 1.
__device__ __forceinline__ float warp_max(const float* x, int n, int lane) {
  float m = num::bits_f32(0xFF800000u);  // -inf: a lane past n adds nothing
  for_lane_share(n, lane, [&](int e, bool) { m = fmaxf(m, x[e]); });  // a repeat changes nothing
  return from_order_key(__reduce_max_sync(kFullMask, order_key(m)));
}

// ---- top-k ----

// (v, i) as one unsigned key that orders like ranks_before(): v's order key above, the index
// below (as is when higher indices rank first, complemented when lower ones do). Keys are > 0.
__device__ __forceinline__ uint64_t rank_key(float v, int i, bool higher_first) {
  const uint32_t lo = higher_first ? static_cast<uint32_t>(i) : ~static_cast<uint32_t>(i);
  return (static_cast<uint64_t>(order_key(v)) << 32) | lo;
}

__device__ __forceinline__ int32_t rank_key_index(uint64_t key, bool higher_first) {
  const uint32_t lo = static_cast<uint32_t>(key);
  return static_cast<int32_t>(higher_first ? lo : ~lo);
}

// The two largest keys below `bound` of the lane's items value(lane), value(lane + 32), ... < n
// (0 where there are fewer). Value: RowValues or GroupScores.
template <typename Value>
__device__ __forceinline__ void lane_top2(const Value& value, int n, int lane, uint64_t bound,
                                          bool higher_first, uint64_t* first, uint64_t* second) {
  uint64_t a = 0, b = 0;
  for_lane_share<Value::kUnroll>(n, lane, [&](int i, bool own) {
    // Only own items are read: the clamped index of a lane past the end is another lane's item,
    // which that lane may be writing now (softmax_top_k_warp() has no barrier before this).
    if (!own) return;
    const uint64_t key = rank_key(value(i), i, higher_first);
    if (key >= bound) return;
    if (key > a) {
      b = a;
      a = key;
    } else if (key > b) {
      b = key;
    }
  });
  *first = a;
  *second = b;
}

// Whether this lane's key is the largest of the warp's (keys are distinct, so one lane's is). One
// reduction of the upper halves; only when several lanes share that value (a tie) a second one of
// the indices. Both branches on `tied` are warp-uniform (every lane has the same ballot), so all 32
// lanes reach each full-mask reduction. The second reduction must stay outside `at_top && ...`:
// there the short circuit skips it on the lanes below the top, and the tied lanes wait in a
// full-mask reduction the others never join -- on hardware the warp hangs at the first tie.
__device__ __forceinline__ bool warp_owns_best(uint64_t key) {
  const uint32_t hi = static_cast<uint32_t>(key >> 32);
  const uint32_t top = __reduce_max_sync(kFullMask, hi);
  const bool at_top = hi == top;
  const unsigned tied = __ballot_sync(kFullMask, at_top);
  if ((tied & (tied - 1)) == 0) return at_top;
  const uint32_t lo = static_cast<uint32_t>(key);
  const uint32_t best_lo = __reduce_max_sync(kFullMask, at_top ? lo : 0u);  // every lane
  return at_top && lo == best_lo;
}

__device__ __forceinline__ void order_pair(uint64_t& a, uint64_t& b) {  // a >= b after
  const bool swap = b > a;
  const uint64_t hi = swap ? b : a;
  b = swap ? a : b;
  a = hi;
}

// Up to kItems items a lane (n <= 32 kItems): the lane sorts its keys once, best first, in
// registers, so every pick is one reduction and a ballot, and the lane that wins shifts its
// list by one; no rescans. A single warp routing one token spends most of its time in dependent
// instruction latency (about 6 cycles an instruction, Nsight Compute), and the rescanning form
// took about 90 instructions a pick at E = 128.
template <int kItems, typename Value>
__device__ __forceinline__ uint64_t warp_select_sorted(const Value& value, int n, int k,
                                                       bool higher_first, int lane, int32_t* ids) {
  uint64_t q[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int e = lane + i * kWarpSize;  // only the lane's own items: see lane_top2()
    q[i] = e < n ? rank_key(value(e), e, higher_first) : 0ull;
  }
#pragma unroll
  for (int i = 0; i < kItems; ++i) {  // odd-even transposition: kItems rounds sort kItems keys
#pragma unroll
    for (int j = i % 2; j + 1 < kItems; j += 2) order_pair(q[j], q[j + 1]);
  }
  uint64_t bound = ~0ull;
  QMOE_NO_UNROLL
  for (int j = 0; j < k; ++j) {
    if (warp_owns_best(q[0])) {
      if (ids != nullptr) ids[j] = rank_key_index(q[0], higher_first);
      bound = q[0];
#pragma unroll
      for (int i = 0; i + 1 < kItems; ++i) q[i] = q[i + 1];
      q[kItems - 1] = 0ull;
    }
  }
  return bound;
}

// The k best of value(0, n) in rank order (k <= n), like select_top_k(): the lane owning pick j
// stores its index to ids[j] when ids is set. Up to 32 kSortedMax items (4 or 8 a lane),
// warp_select_sorted(); beyond, each lane keeps its two best unpicked keys and rescans its share
// only after both are picked, so a pick mostly costs one reduction and a ballot. Returns the key
// of the lane's last pick (~0 when it made none): the lane's picked items are exactly those of
// its items whose keys are >= that. The grouped top-k and the sparse mixer take kSortedMax 4:
// with 8 keys a lane their fused routing kernels spilled at its 64 registers a thread (16 and 24
// bytes of stack; none with 4), and DeepSeek-V3's layer at one token took 188.5 us against 173.1
// without the sorted form (bench/results/2026-12-06-h100-split-two.md).
template <int kSortedMax = 8, typename Value>
__device__ __forceinline__ uint64_t warp_select(const Value& value, int n, int k, bool higher_first,
                                                int lane, int32_t* ids) {
  static_assert(kSortedMax == 4 || kSortedMax == 8, "4 or 8 sorted keys a lane");
  if (n <= 4 * kWarpSize) return warp_select_sorted<4>(value, n, k, higher_first, lane, ids);
  if constexpr (kSortedMax == 8) {
    if (n <= 8 * kWarpSize) return warp_select_sorted<8>(value, n, k, higher_first, lane, ids);
  }
  uint64_t bound = ~0ull;          // the lane's last pick; its items ranked after it are unpicked
  uint64_t first = 0, second = 0;  // its best and second best unpicked keys
  bool rescan = true;              // both must be found again below bound
  bool spare = false;              // second holds a key not yet promoted to first
  QMOE_NO_UNROLL
  for (int j = 0; j < k; ++j) {
    if (rescan) {
      lane_top2(value, n, lane, bound, higher_first, &first, &second);
      rescan = false;
      spare = true;
    }
    if (warp_owns_best(first)) {
      if (ids != nullptr) ids[j] = rank_key_index(first, higher_first);
      bound = first;
      first = second;
      rescan = !spare;
      spare = false;
    }
  }
  return bound;
}

// A shared-memory row as value(i), for warp_select(); kUnroll: how far lane_top2() unrolls its
// scan (for_lane_share()).
struct RowValues {
  static constexpr int kUnroll = 4;
  const float* v;
  __device__ float operator()(int i) const { return v[i]; }
};

// DeepSeek's groups as value(g): group_score() of group g, a loop of its own, so not unrolled.
struct GroupScores {
  static constexpr int kUnroll = 1;
  const float* c;
  int size;
  __device__ float operator()(int g) const { return routing::group_score(c, g * size, size); }
};

// ---- the methods; n = E - num_shared routed experts, x = logits, work = E floats. Each writes
// the picks to ids and returns the row routing::slot_weight() takes the slots' values from, as
// the host's methods do.

__device__ __forceinline__ const float* softmax_top_k_warp(const RoutingSpec& r, int n,
                                                           const float* x, float* p, int32_t* ids,
                                                           int lane) {
  const float m = warp_max(x, n, lane);
  float partial = 0.0f;
  for_lane_share(n, lane, [&](int e, bool own) {
    const float pe = routing::exp_f32(x[e] - m);
    if (!own) return;
    p[e] = pe;
    partial = partial + pe;
  });
  const float sum = warp_sum(partial);
  for_lane_share(n, lane, [&](int e, bool own) {
    if (own) p[e] = p[e] / sum;  // never the clamped index: another lane writes that one
  });
  // A lane ranks only its own experts, which it wrote itself: no barrier before the selection.
  warp_select(RowValues{p}, n, r.top_k, r.ties == TieBreak::kHigherIndex, lane, ids);
  return p;
}

// Top-k softmax and top-k sigmoid: the selection alone; slot_weight() does the rest.
__device__ __forceinline__ const float* top_k_of_logits_warp(const RoutingSpec& r, int n,
                                                             const float* x, int32_t* ids,
                                                             int lane) {
  warp_select(RowValues{x}, n, r.top_k, r.ties == TieBreak::kHigherIndex, lane, ids);
  return x;
}

// Each pass sums the lanes' sparse_mixer_term()s in warp order; the pass's weight goes to
// work[pick], the row slot_weight() reads.
__device__ __forceinline__ const float* sparse_mixer_warp(const RoutingSpec& r, int n,
                                                          const float* x, float* work, int32_t* ids,
                                                          int lane) {
  const float two_eps = 2.0f * r.sparse_mixer_eps;
  warp_select<4>(RowValues{x}, n, 2, r.ties == TieBreak::kHigherIndex, lane, ids);
  __syncwarp();
  const int first = ids[0];
  QMOE_NO_UNROLL
  for (int j = 0; j < 2; ++j) {
    const int pick = ids[j];
    const float m = x[pick];
    float partial = 0.0f;
    for_lane_share(n, lane, [&](int e, bool own) {
      const float term = routing::sparse_mixer_term(m, x[e], two_eps);
      if (!own) return;
      partial = partial + (j == 1 && e == first ? 0.0f : term);  // x'[i1] = -inf adds +0
    });
    const float w = routing::exp_f32(x[pick] - m) / warp_sum(partial);
    if (lane == 0) work[pick] = w;
  }
  return work;
}

// s overwrites x[0, n), c fills work[0, n). Groups are ranked like experts, with group_score()
// as their value; a lane owns groups lane, lane + 32, ... and masks the experts of those it did
// not pick (the picked ones are exactly those whose keys reach its last pick).
__device__ __forceinline__ const float* grouped_top_k_warp(const RoutingSpec& r, int n, float* x,
                                                           const float* bias, float* work,
                                                           int32_t* ids, int lane) {
  const bool higher = r.ties == TieBreak::kHigherIndex;
  float* s = x;
  float* c = work;
  load_row(bias, DType::kF32, n, c, lane);
  for_lane_share(n, lane, [&](int e, bool own) {
    if (!own) return;  // s is x: the clamped index is another lane's, which it overwrites now
    const float se = routing::sigmoid_f32(x[e]);
    s[e] = se;
    c[e] = se + c[e];
  });
  __syncwarp();
  const int size = n / r.n_group;
  const GroupScores score{c, size};
  const uint64_t kept_from = warp_select<4>(score, r.n_group, r.topk_group, higher, lane, nullptr);
  for (int g = lane; g < r.n_group; g += kWarpSize) {
    // With at most 32 groups a lane owns one: it is kept iff the lane picked.
    const bool kept = kept_from != ~0ull &&
                      (r.n_group <= kWarpSize || rank_key(score(g), g, higher) >= kept_from);
    if (kept) continue;
    for (int e = g * size; e < (g + 1) * size; ++e) c[e] = num::bits_f32(0xFF800000u);  // -inf
  }
  __syncwarp();
  warp_select<4>(RowValues{c}, n, r.top_k, higher, lane, ids);
  return s;
}

// Routes token t: ids and weights of its slots, to sids / sw and to the output. A token with a
// non-finite logit or router weight is routed as if its logits were all zero, its weights become
// NaN and the error word records it (device_routing.h).
template <RoutingMethod kMethod>
__device__ __forceinline__ void route_token_warp(const TokenRouting& a, int64_t t, float* x,
                                                 float* work, int32_t* sids, float* sw, int lane) {
  // The method as a constant, so that the shared helpers' switches on it fold to this method's
  // arithmetic (a kernel holds one method's code: with_routing_method()).
  RoutingSpec r = a.spec;
  r.method = kMethod;
  const int num_e = a.experts;
  const int n = num_e - r.num_shared;
  const int k = r.top_k;
  const void* logits = row_of(a.logits, a.logits_dtype, t, num_e);
  const bool gathered = a.router_weights != nullptr;
  const void* rw = gathered ? row_of(a.router_weights, a.rw_dtype, t, num_e) : nullptr;

  bool bad_logit = false;
  bool bad_weight = false;
  // The logits into x, then (only checked) the router weights: one copy of the loads' code.
  QMOE_NO_UNROLL
  for (int pass = 0; pass < (gathered ? 2 : 1); ++pass) {
    const bool bad = load_row(pass == 0 ? logits : rw, pass == 0 ? a.logits_dtype : a.rw_dtype,
                              num_e, pass == 0 ? x : nullptr, lane);
    if (pass == 0) {
      bad_logit = bad;
    } else {
      bad_weight = bad;
    }
  }
  bad_logit = __any_sync(kFullMask, bad_logit);
  bad_weight = __any_sync(kFullMask, bad_weight);
  const bool bad = bad_logit || bad_weight;
  if (bad) {
    QMOE_NO_UNROLL
    for (int e = lane; e < num_e; e += kWarpSize) x[e] = 0.0f;
    if (lane == 0) {
      atomicOr(a.error, (bad_logit ? kErrorLogits : 0) | (bad_weight ? kErrorRouterWeights : 0));
      atomicMin(a.error + 1, static_cast<int32_t>(t));
    }
  }
  __syncwarp();

  const float* values;
  if constexpr (kMethod == RoutingMethod::kSoftmaxTopK) {
    values = softmax_top_k_warp(r, n, x, work, sids, lane);
  } else if constexpr (kMethod == RoutingMethod::kSparseMixer) {
    values = sparse_mixer_warp(r, n, x, work, sids, lane);
  } else if constexpr (kMethod == RoutingMethod::kGroupedTopK) {
    values = grouped_top_k_warp(r, n, x, a.bias, work, sids, lane);
  } else {
    static_assert(kMethod == RoutingMethod::kTopKSoftmax || kMethod == RoutingMethod::kTopKSigmoid,
                  "a routing method without a warp path");
    values = top_k_of_logits_warp(r, n, x, sids, lane);
  }
  __syncwarp();

  // Slot j's weight on lane j % 32 (sw[j] keeps it), and the k weights' sum in slot order: every
  // lane adds them as shuffled from their lanes, four at a time. A batch may run past slot k - 1
  // into lanes holding +0: a sum that starts at +0 is never -0, so adding +0 changes no bit.
  float sum = 0.0f;
  QMOE_NO_UNROLL
  for (int c = 0; c < k; c += kWarpSize) {
    const int j = c + lane;
    float w = 0.0f;
    if (j < k) {
      const int id = sids[j];
      w = gathered ? load_as_f32(rw, a.rw_dtype, id)
                   : routing::slot_weight(r, values[id], values[sids[0]]);
      sw[j] = w;
    }
    const int count = min(kWarpSize, k - c);
    QMOE_NO_UNROLL
    for (int i = 0; i < count; i += 4) {
      const float w0 = __shfl_sync(kFullMask, w, i);
      const float w1 = __shfl_sync(kFullMask, w, i + 1);
      const float w2 = __shfl_sync(kFullMask, w, i + 2);
      const float w3 = __shfl_sync(kFullMask, w, i + 3);
      sum = sum + w0;
      sum = sum + w1;
      sum = sum + w2;
      sum = sum + w3;
    }
  }
  // Each lane finishes its own slots (the shared experts too) and writes them out; sids and sw
  // keep them for the caller.
  QMOE_NO_UNROLL
  for (int j = lane; j < a.slots; j += kWarpSize) {
    int32_t id;
    float w;
    if (j < k) {
      id = sids[j];
      w = routing::finish_slot_weight(r, gathered, sw[j], sum);
    } else {
      // Shared experts: x[n, E) is never overwritten by the methods.
      id = n + (j - k);
      w = routing::shared_slot_weight(r, x[id]);
    }
    if (bad) w = num::bits_f32(0x7FC00000u);  // quiet NaN
    if (j >= k) sids[j] = id;
    sw[j] = w;
    a.ids[t * a.slots + j] = id;
    a.weights[t * a.slots + j] = w;
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

// qmoe: the per-token routing arithmetic, shared by the host (route()) and the device
// (src/cuda/routing/route_warp.cuh).
//
// Everything here is written so that a plain C++ build and an nvcc build produce the same bits:
//   - exp is our own (exp_f32), not the platform's expf, whose last-bit behaviour differs;
//   - every multiply-add that is meant to be fused is an explicit fmaf, and every other operation
//     stands alone (the library is built with -ffp-contract=off; device code must keep the same
//     separate roundings, e.g. with __fmul_rn / __fadd_rn / __fdiv_rn);
//   - every sum over the experts runs in warp order (warp_order_sum() says what and why), every
//     sum over the k selected slots sequentially in slot order;
//   - no containers, exceptions or recursion; loops run over counts passed in, scratch comes in.
// Inputs are assumed validated (finite logits, parameters in range): route() does that on the host.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/numeric.h"
#include "qmoe/layer.h"

namespace qmoe {
namespace routing {

// Renormalization is skipped when the weights sum to at most this (ORT's rule).
constexpr float kRenormMinSum = 1e-6f;
// DeepSeek-V3 adds this to the denominator instead of skipping.
constexpr float kGroupedDenomEps = 1e-20f;
// The partial sums of warp_order_sum(): the lanes of a CUDA warp.
constexpr int kWarpLanes = 32;

// exp(x) in fp32, identical on every target. Error: at most 2 ulp by contract, 0.94 ulp measured
// over every float in [-104, 88].
//   x = n ln2 + r, n = rint(x log2 e), |r| <~ ln2 / 2, r computed with a two-constant ln2 split
//   exp(r) by its degree-7 Taylor polynomial (truncation error < 0.07 ulp on that interval)
//   exp(x) = exp(r) 2^n, the scaling done in two exact-or-once-rounded steps so that gradual
//   underflow rounds once and overflow gives inf.
QMOE_HD float exp_f32(float x) {
  if (x != x) return x;
  // exp(89) > FLT_MAX; exp(-104) < 2^-150, half the smallest subnormal, so it rounds to 0.
  if (x > 89.0f) return num::bits_f32(0x7F800000u);
  if (x < -104.0f) return 0.0f;
  const float kLog2e = 1.44269502162933349609375f;
  const float kLn2Hi = 0.693145751953125f;  // 16 significant bits: n * kLn2Hi is exact
  const float kLn2Lo = 1.428606765330187045e-06f;
  // Adding 1.5 * 2^23 rounds to an integer (to nearest, ties to even) without libm's rintf.
  const float kRoundMagic = 12582912.0f;
  const float t = x * kLog2e;
  const float nf = (t + kRoundMagic) - kRoundMagic;
  const int n = static_cast<int>(nf);
  float r = fmaf(-nf, kLn2Hi, x);
  r = fmaf(-nf, kLn2Lo, r);
  // 1/k! rounded to fp32, k = 7 .. 2.
  float p = 1.98412701138295233249664306640625e-4f;
  p = fmaf(p, r, 1.3888889225199818611145019531250e-3f);
  p = fmaf(p, r, 8.3333337679505348205566406250000e-3f);
  p = fmaf(p, r, 4.1666667908430099487304687500000e-2f);
  p = fmaf(p, r, 1.6666667163372039794921875000000e-1f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  // n is in [-150, 128]; 2^m has exponent bits m + 127 for m in [-126, 127].
  if (n > 127) {
    const float a = num::bits_f32(static_cast<uint32_t>(n) << 23);  // 2^(n - 127) = 2
    return (p * a) * num::bits_f32(254u << 23);  // * 2^127 overflows to inf when due
  }
  if (n < -126) {
    // p * 2^(n + 126) is normal and exact; the multiply by 2^-126 is the only rounding.
    const float a = num::bits_f32(static_cast<uint32_t>(n + 126 + 127) << 23);
    return (p * a) * num::bits_f32(1u << 23);
  }
  return p * num::bits_f32(static_cast<uint32_t>(n + 127) << 23);
}

QMOE_HD float sigmoid_f32(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// The ranking every method uses: larger value first; equal values by index, lower first unless
// higher_first. Values are never NaN here, -inf is allowed (masked entries).
QMOE_HD bool ranks_before(float va, int ia, float vb, int ib, bool higher_first) {
  if (va != vb) return va > vb;
  return higher_first ? ia > ib : ia < ib;
}

// ids[0, k) = the k best of v[0, n) in rank order; requires k <= n. Pass j takes the best element
// ranked after pick j - 1, so nothing is marked and equal values come out once each.
QMOE_HD void select_top_k(const float* v, int n, int k, bool higher_first, int32_t* ids) {
  int prev = -1;
  QMOE_NO_UNROLL
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (prev >= 0 && !ranks_before(v[prev], prev, v[e], e, higher_first)) continue;
      if (best < 0 || ranks_before(v[e], e, v[best], best, higher_first)) best = e;
    }
    ids[j] = best;
    prev = best;
  }
}

// The sum of x[0, n) in warp order, the order of every sum over the experts: kWarpLanes = 32
// partial sums, partial l adding x[l], x[l + 32], x[l + 64], ... one by one in index order from
// +0, then combined by an xor butterfly: for off = 16, 8, 4, 2, 1, s[l] = s[l] + s[l ^ off].
// Why this order: the device routes a token with one warp whose lane l owns experts l, l + 32,
// ...; each lane adds its own experts and five shuffles combine the lanes, where a sequential sum
// over all n experts kept 31 lanes idle behind one lane's chain of n dependent additions. fp32
// addition is commutative, so s[l] + s[l ^ off] and s[l ^ off] + s[l] round alike and every lane
// ends with the same bits. The host follows lane 0's result only: at step off it is built from
// lanes l < off, each adding s[l + off].
QMOE_HD float warp_order_sum(const float* x, int n) {
  float s[kWarpLanes];
  for (int l = 0; l < kWarpLanes; ++l) {
    float partial = 0.0f;
    for (int e = l; e < n; e += kWarpLanes) partial = partial + x[e];
    s[l] = partial;
  }
  for (int off = kWarpLanes / 2; off > 0; off /= 2) {
    for (int l = 0; l < off; ++l) s[l] = s[l] + s[l + off];
  }
  return s[0];
}

// The weight of a top-k slot before any normalization, from v, the selected expert's value in the
// row its method returns (the methods below), and v0, the value of the first pick (the maximum,
// for top-k softmax). The host and the device both compute every slot's weight with this.
QMOE_HD float slot_weight(const RoutingSpec& r, float v, float v0) {
  switch (r.method) {
    case RoutingMethod::kTopKSoftmax:
      return exp_f32(v - v0);
    case RoutingMethod::kTopKSigmoid:
      return sigmoid_f32(v);
    default:
      return v;  // p, s or the sparse mixer's weight itself
  }
}

// A shared expert's weight from its router logit v (the host and the device both use this).
QMOE_HD float shared_slot_weight(const RoutingSpec& r, float v) {
  return r.shared_weight == SharedWeight::kOne ? 1.0f : sigmoid_f32(v);
}

// A slot's final weight from its weight w (slot_weight(), or router_weights[t, id] when gathered)
// and sum, the k slots' weights added in slot order from +0: the method's normalization, then
// DeepSeek's scaling. With router_weights the method's own normalization gives way to the
// renormalization rule, which applies to every method when normalize is set.
QMOE_HD float finish_slot_weight(const RoutingSpec& r, bool gathered, float w, float sum) {
  const bool grouped = r.method == RoutingMethod::kGroupedTopK;
  if (!gathered && r.method == RoutingMethod::kTopKSoftmax) return w / sum;  // sum >= exp(0) = 1
  if (!gathered && r.method == RoutingMethod::kSparseMixer) return w;        // never normalized
  if (r.normalize) {
    if (grouped && !gathered) {
      w = w / (sum + kGroupedDenomEps);  // DeepSeek-V3: never skipped
    } else if (sum > kRenormMinSum) {
      w = w / sum;
    }
  }
  return grouped ? w * r.routed_scaling_factor : w;
}

// finish_slot_weight() over the k slots w[0, k), their sum running sequentially in slot order
// (k is at most 16 or so: the device gathers the k weights by shuffles and adds them in order).
QMOE_HD void finish_slot_weights(const RoutingSpec& r, bool gathered, float* w) {
  float sum = 0.0f;
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) sum = sum + w[j];
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) w[j] = finish_slot_weight(r, gathered, w[j], sum);
}

// ---- the methods. x: logits of the n = E - num_shared routed experts; ids: the top_k picks.
// Each returns the row whose values at the picks give the slots' weights through slot_weight().

// ORT CUDA: p = softmax(x) over all n, top-k of p, optional renormalization. p: n floats.
QMOE_HD const float* softmax_top_k(const RoutingSpec& r, int n, const float* x, float* p,
                                   int32_t* ids) {
  float m = x[0];
  for (int e = 1; e < n; ++e) m = x[e] > m ? x[e] : m;
  for (int e = 0; e < n; ++e) p[e] = exp_f32(x[e] - m);
  const float sum = warp_order_sum(p, n);
  for (int e = 0; e < n; ++e) p[e] = p[e] / sum;
  select_top_k(p, n, r.top_k, r.ties == TieBreak::kHigherIndex, ids);
  return p;
}

// Mixtral / Qwen / ORT CPU: top-k of x, softmax over the k selected (so always normalized).
QMOE_HD const float* top_k_softmax(const RoutingSpec& r, int n, const float* x, int32_t* ids) {
  select_top_k(x, n, r.top_k, r.ties == TieBreak::kHigherIndex, ids);
  return x;
}

// Whether the sparse mixer drops logit xe against the current maximum m. NaN (only 0 / 0, i.e.
// xe == m == 0) compares false and keeps it, as in the reference.
QMOE_HD bool sparse_mixer_masked(float m, float xe, float two_eps) {
  const float axe = xe < 0.0f ? -xe : xe;
  const float factor = axe > m ? axe : m;
  return (m - xe) / factor > two_eps;
}

// What logit xe adds to the sparse mixer's softmax sum against the maximum m: exp(xe - m), or +0
// when masked. All terms are >= +0, so a sum from +0 that adds +0 for an entry has the bits of one
// that skips it: the sum over the kept entries.
QMOE_HD float sparse_mixer_term(float m, float xe, float two_eps) {
  return sparse_mixer_masked(m, xe, two_eps) ? 0.0f : exp_f32(xe - m);
}

// PhiMoE sparse mixer, inference path (k = 2). The reference (modeling_phimoe.py, sparsemixer):
//   m1, i1 = max(x);            mask_e = (m1 - x_e) / max(|x_e|, m1) > 2 eps
//   w1 = softmax(x with masked entries set to -inf)[i1]
//   x' = x with x'[i1] = -inf;  m2, i2 = max(x');  mask_e = (m2 - x_e) / max(|x_e|, m2) > 2 eps
//   w2 = softmax(x' with masked entries set to -inf)[i2]
// Note the second mask compares the ORIGINAL x_e, while the softmax runs over x'. Here the
// softmax weight at the maximum is exp(0) / sum, the sum running in warp order over the terms of
// sparse_mixer_term(); x'[i1] = -inf adds exp(-inf) = +0. No renormalization: the two weights are
// what the model uses. work: n floats; on return work[ids[j]] = w_j, the row of the weights.
QMOE_HD const float* sparse_mixer(const RoutingSpec& r, int n, const float* x, float* work,
                                  int32_t* ids) {
  const bool higher = r.ties == TieBreak::kHigherIndex;
  const float two_eps = 2.0f * r.sparse_mixer_eps;
  select_top_k(x, n, 2, higher, ids);  // i1, then the best of the rest: i2 = argmax x'
  float w[2];
  for (int j = 0; j < 2; ++j) {
    const float m = x[ids[j]];
    for (int e = 0; e < n; ++e) {
      work[e] = j == 1 && e == ids[0] ? 0.0f : sparse_mixer_term(m, x[e], two_eps);
    }
    w[j] = exp_f32(x[ids[j]] - m) / warp_order_sum(work, n);
  }
  work[ids[0]] = w[0];
  work[ids[1]] = w[1];
  return work;
}

// The DeepSeek-V3 group score: the sum of the two largest c of the group (the one for size 1).
QMOE_HD float group_score(const float* c, int first, int size) {
  float a = c[first];
  if (size == 1) return a;
  float b = c[first + 1];
  if (b > a) {
    const float t = a;
    a = b;
    b = t;
  }
  for (int e = first + 2; e < first + size; ++e) {
    if (c[e] > a) {
      b = a;
      a = c[e];
    } else if (c[e] > b) {
      b = c[e];
    }
  }
  return a + b;
}

// DeepSeek-V3 noaux_tc: s = sigmoid(x), c = s + bias; the n experts form n_group equal groups
// scored by group_score(); the topk_group best groups stay; top-k of c among their experts;
// weights are s (not c), optionally divided by (sum + 1e-20), then scaled by
// routed_scaling_factor (finish_slot_weight()). s overwrites x[0, n); c uses work[0, n).
QMOE_HD const float* grouped_top_k(const RoutingSpec& r, int n, float* x, const float* bias,
                                   float* work, int32_t* ids) {
  const bool higher = r.ties == TieBreak::kHigherIndex;
  float* s = x;
  float* c = work;
  for (int e = 0; e < n; ++e) {
    s[e] = sigmoid_f32(x[e]);
    c[e] = s[e] + bias[e];
  }
  const int size = n / r.n_group;
  // The last of the topk_group best groups; a group is kept iff it ranks no lower than that one.
  int last = -1;
  float last_score = 0.0f;
  QMOE_NO_UNROLL
  for (int j = 0; j < r.topk_group; ++j) {
    int best = -1;
    float best_score = 0.0f;
    for (int g = 0; g < r.n_group; ++g) {
      const float sg = group_score(c, g * size, size);
      if (last >= 0 && !ranks_before(last_score, last, sg, g, higher)) continue;
      if (best < 0 || ranks_before(sg, g, best_score, best, higher)) {
        best = g;
        best_score = sg;
      }
    }
    last = best;
    last_score = best_score;
  }
  for (int g = 0; g < r.n_group; ++g) {
    if (g == last) continue;
    const float sg = group_score(c, g * size, size);
    if (ranks_before(sg, g, last_score, last, higher)) continue;
    for (int e = g * size; e < (g + 1) * size; ++e) c[e] = num::bits_f32(0xFF800000u);  // -inf
  }
  // c of kept experts is finite (s in [0, 1], bias finite), so the k picks are all kept experts.
  select_top_k(c, n, r.top_k, higher, ids);
  return s;
}

// Llama-4: top-k of x, weight sigmoid(x); renormalized only if asked.
QMOE_HD const float* top_k_sigmoid(const RoutingSpec& r, int n, const float* x, int32_t* ids) {
  select_top_k(x, n, r.top_k, r.ties == TieBreak::kHigherIndex, ids);
  return x;
}

// One token. x: its E logits (clobbered for kGroupedTopK); work: E floats; bias: E - num_shared
// floats for kGroupedTopK (else unused); ids, w: the token's slots (top_k + num_shared).
QMOE_HD void route_token(const RoutingSpec& r, int num_experts, float* x, const float* bias,
                         float* work, int32_t* ids, float* w) {
  const int n = num_experts - r.num_shared;
  const float* row = x;
  switch (r.method) {
    case RoutingMethod::kSoftmaxTopK:
      row = softmax_top_k(r, n, x, work, ids);
      break;
    case RoutingMethod::kTopKSoftmax:
      row = top_k_softmax(r, n, x, ids);
      break;
    case RoutingMethod::kSparseMixer:
      row = sparse_mixer(r, n, x, work, ids);
      break;
    case RoutingMethod::kGroupedTopK:
      row = grouped_top_k(r, n, x, bias, work, ids);
      break;
    case RoutingMethod::kTopKSigmoid:
      row = top_k_sigmoid(r, n, x, ids);
      break;
  }
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) w[j] = slot_weight(r, row[ids[j]], row[ids[0]]);
  finish_slot_weights(r, /*gathered=*/false, w);
  // Shared experts: always on, outside any normalization.
  QMOE_NO_UNROLL
  for (int i = 0; i < r.num_shared; ++i) {
    ids[r.top_k + i] = n + i;
    w[r.top_k + i] = shared_slot_weight(r, x[n + i]);
  }
}

}  // namespace routing
}  // namespace qmoe

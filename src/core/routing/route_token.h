// qmoe: the per-token routing arithmetic, shared by the host (route()) and, later, the device.
//
// Everything here is written so that a plain C++ build and an nvcc build produce the same bits:
//   - exp is our own (exp_f32), not the platform's expf, whose last-bit behaviour differs;
//   - every multiply-add that is meant to be fused is an explicit fmaf, and every other operation
//     stands alone (the library is built with -ffp-contract=off; device code must keep the same
//     separate roundings, e.g. with __fmul_rn / __fadd_rn / __fdiv_rn);
//   - every sum runs sequentially in index (or selection) order;
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

// w[0, k) /= their sum (summed in slot order), unless the sum is <= kRenormMinSum.
QMOE_HD void renormalize(float* w, int k) {
  float sum = 0.0f;
  QMOE_NO_UNROLL
  for (int j = 0; j < k; ++j) sum = sum + w[j];
  if (!(sum > kRenormMinSum)) return;
  QMOE_NO_UNROLL
  for (int j = 0; j < k; ++j) w[j] = w[j] / sum;
}

// ---- the methods. x: logits of the n = E - num_shared routed experts; ids, w: top_k slots ----

// ORT CUDA: p = softmax(x) over all n, top-k of p, optional renormalization.
QMOE_HD void softmax_top_k(const RoutingSpec& r, int n, const float* x, float* p, int32_t* ids,
                           float* w) {
  float m = x[0];
  for (int e = 1; e < n; ++e) m = x[e] > m ? x[e] : m;
  float sum = 0.0f;
  for (int e = 0; e < n; ++e) {
    p[e] = exp_f32(x[e] - m);
    sum = sum + p[e];
  }
  for (int e = 0; e < n; ++e) p[e] = p[e] / sum;
  select_top_k(p, n, r.top_k, r.ties == TieBreak::kHigherIndex, ids);
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) w[j] = p[ids[j]];
  if (r.normalize) renormalize(w, r.top_k);
}

// Mixtral / Qwen / ORT CPU: top-k of x, softmax over the k selected (so always normalized).
QMOE_HD void top_k_softmax(const RoutingSpec& r, int n, const float* x, int32_t* ids, float* w) {
  select_top_k(x, n, r.top_k, r.ties == TieBreak::kHigherIndex, ids);
  const float m = x[ids[0]];
  float sum = 0.0f;
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) {
    w[j] = exp_f32(x[ids[j]] - m);
    sum = sum + w[j];
  }
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) w[j] = w[j] / sum;  // sum >= 1: exp(0) is in it
}

// Whether the sparse mixer drops logit xe against the current maximum m. NaN (only 0 / 0, i.e.
// xe == m == 0) compares false and keeps it, as in the reference.
QMOE_HD bool sparse_mixer_masked(float m, float xe, float two_eps) {
  const float axe = xe < 0.0f ? -xe : xe;
  const float factor = axe > m ? axe : m;
  return (m - xe) / factor > two_eps;
}

// PhiMoE sparse mixer, inference path (k = 2). The reference (modeling_phimoe.py, sparsemixer):
//   m1, i1 = max(x);            mask_e = (m1 - x_e) / max(|x_e|, m1) > 2 eps
//   w1 = softmax(x with masked entries set to -inf)[i1]
//   x' = x with x'[i1] = -inf;  m2, i2 = max(x');  mask_e = (m2 - x_e) / max(|x_e|, m2) > 2 eps
//   w2 = softmax(x' with masked entries set to -inf)[i2]
// Note the second mask compares the ORIGINAL x_e, while the softmax runs over x'. Here the
// softmax weight at the maximum is exp(0) / sum = 1 / sum, the sum running in index order over
// the kept entries; x'[i1] = -inf would only add exp(-inf) = +0, so it is skipped. No
// renormalization: the two weights are what the model uses.
QMOE_HD void sparse_mixer(const RoutingSpec& r, int n, const float* x, int32_t* ids, float* w) {
  const bool higher = r.ties == TieBreak::kHigherIndex;
  const float two_eps = 2.0f * r.sparse_mixer_eps;
  select_top_k(x, n, 2, higher, ids);  // i1, then the best of the rest: i2 = argmax x'
  for (int j = 0; j < 2; ++j) {
    const float m = x[ids[j]];
    float sum = 0.0f;
    for (int e = 0; e < n; ++e) {
      if (j == 1 && e == ids[0]) continue;
      if (sparse_mixer_masked(m, x[e], two_eps)) continue;
      sum = sum + exp_f32(x[e] - m);
    }
    w[j] = exp_f32(x[ids[j]] - m) / sum;
  }
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
// routed_scaling_factor. s overwrites x[0, n); c uses work[0, n).
QMOE_HD void grouped_top_k(const RoutingSpec& r, int n, float* x, const float* bias, float* work,
                           int32_t* ids, float* w) {
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
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) w[j] = s[ids[j]];
  if (r.normalize) {
    float sum = 0.0f;
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) sum = sum + w[j];
    const float denom = sum + kGroupedDenomEps;
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) w[j] = w[j] / denom;
  }
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) w[j] = w[j] * r.routed_scaling_factor;
}

// Llama-4: top-k of x, weight sigmoid(x); renormalized only if asked.
QMOE_HD void top_k_sigmoid(const RoutingSpec& r, int n, const float* x, int32_t* ids, float* w) {
  select_top_k(x, n, r.top_k, r.ties == TieBreak::kHigherIndex, ids);
  QMOE_NO_UNROLL
  for (int j = 0; j < r.top_k; ++j) w[j] = sigmoid_f32(x[ids[j]]);
  if (r.normalize) renormalize(w, r.top_k);
}

// One token. x: its E logits (clobbered for kGroupedTopK); work: E floats; bias: E - num_shared
// floats for kGroupedTopK (else unused); ids, w: the token's slots (top_k + num_shared).
QMOE_HD void route_token(const RoutingSpec& r, int num_experts, float* x, const float* bias,
                         float* work, int32_t* ids, float* w) {
  const int n = num_experts - r.num_shared;
  switch (r.method) {
    case RoutingMethod::kSoftmaxTopK:
      softmax_top_k(r, n, x, work, ids, w);
      break;
    case RoutingMethod::kTopKSoftmax:
      top_k_softmax(r, n, x, ids, w);
      break;
    case RoutingMethod::kSparseMixer:
      sparse_mixer(r, n, x, ids, w);
      break;
    case RoutingMethod::kGroupedTopK:
      grouped_top_k(r, n, x, bias, work, ids, w);
      break;
    case RoutingMethod::kTopKSigmoid:
      top_k_sigmoid(r, n, x, ids, w);
      break;
  }
  // Shared experts: always on, weight sigmoid(own logit), outside any normalization.
  QMOE_NO_UNROLL
  for (int i = 0; i < r.num_shared; ++i) {
    ids[r.top_k + i] = n + i;
    w[r.top_k + i] = sigmoid_f32(x[n + i]);
  }
}

// With router_weights the selection stands and w[0, top_k) have been replaced by
// router_weights[t, ids[j]]; this applies what the method applies after its own weights.
QMOE_HD void finish_gathered_weights(const RoutingSpec& r, float* w) {
  if (r.normalize) renormalize(w, r.top_k);
  if (r.method == RoutingMethod::kGroupedTopK) {
    QMOE_NO_UNROLL
    for (int j = 0; j < r.top_k; ++j) w[j] = w[j] * r.routed_scaling_factor;
  }
}

}  // namespace routing
}  // namespace qmoe

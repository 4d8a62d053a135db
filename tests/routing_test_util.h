// Helpers shared by the routing tests (test_routing.cpp, test_routing_rules.cpp): route() run into
// owned maps, spaced random inputs, and a plainly written fp64 reference of every method.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <vector>

#include "qmoe/routing.h"

namespace qmoe::routing_test {

inline constexpr double kWeightRtol = 1e-6;

// ---------------------------------------------------------------------------------------------
// Running route()

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n) {
    data = static_cast<char*>(::operator new(n == 0 ? 1 : n, std::align_val_t(64)));
  }
  ~AlignedBuffer() { ::operator delete(data, std::align_val_t(64)); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
  size_t size;
};

struct Routed {
  Status status;
  int64_t tokens = 0;
  std::vector<int32_t> ids, counts, offsets, permuted, position;
  std::vector<float> w;
};

inline Routed run_route(const LayerSpec& spec, const TensorView& logits, const TensorView& rw = {},
                        const TensorView& bias = {}, int64_t extra_tokens = 0) {
  const int64_t t = logits.dims[0];
  const int slots = spec.slots();
  AlignedBuffer buf(route_maps_bytes(t + extra_tokens, slots, spec.num_experts));
  RouteMapsView maps = carve_route_maps(buf.data, t + extra_tokens, slots, spec.num_experts);
  RunInputs in;
  in.router_logits = logits;
  in.router_weights = rw;
  Routed out;
  out.status = route(spec, in, bias, &maps);
  if (!out.status.is_ok()) return out;
  const int64_t r = maps.tokens * slots;
  const int64_t e = spec.num_experts;
  out.tokens = maps.tokens;
  out.ids.assign(maps.expert_ids, maps.expert_ids + r);
  out.w.assign(maps.weights, maps.weights + r);
  out.counts.assign(maps.expert_counts, maps.expert_counts + e);
  out.offsets.assign(maps.expert_offsets, maps.expert_offsets + e + 1);
  out.permuted.assign(maps.permuted_route, maps.permuted_route + r);
  out.position.assign(maps.route_position, maps.route_position + r);
  return out;
}

inline LayerSpec make_spec(RoutingMethod method, int64_t experts, int top_k, bool normalize = false,
                           int num_shared = 0) {
  LayerSpec s;
  s.num_experts = experts;
  s.routing.method = method;
  s.routing.top_k = top_k;
  s.routing.normalize = normalize;
  s.routing.num_shared = num_shared;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Inputs

// E logits per token, distinct and at least 0.6 * spacing apart: a shuffled lattice plus jitter,
// so that no selection is decided by rounding.
inline std::vector<float> spaced_logits(int64_t tokens, int64_t e, std::mt19937_64& rng,
                                        float spacing, float center = 0.0f) {
  std::vector<float> v(tokens * e);
  std::uniform_real_distribution<float> jitter(-0.2f * spacing, 0.2f * spacing);
  std::vector<int> perm(e);
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < e; ++i) {
      v[t * e + i] = center + spacing * (perm[i] - 0.5f * e) + jitter(rng);
    }
  }
  return v;
}

inline TensorView f32_view(const std::vector<float>& v, int64_t t, int64_t e) {
  return TensorView(v.data(), DType::kF32, {t, e});
}

// ---------------------------------------------------------------------------------------------
// The fp64 reference, written from the model code's formulas, independent of route_token.h.

struct Ref {
  std::vector<int> ids;
  std::vector<double> w;
  double margin = std::numeric_limits<double>::infinity();  // closest decision to its threshold
};

// Indices of v sorted best first: larger value, then lower (or higher) index.
inline std::vector<int> ranked(const std::vector<double>& v, bool higher) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) {
    if (v[a] != v[b]) return v[a] > v[b];
    return higher ? a > b : a < b;
  });
  return idx;
}

inline double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

inline void renorm_ref(std::vector<double>* w) {
  double s = 0;
  for (double v : *w) s += v;
  if (s <= 1e-6) return;
  for (double& v : *w) v /= s;
}

// x: the token's E logits; bias: E' (grouped only); rw: the token's E router weights or empty.
inline Ref reference(const RoutingSpec& r, const std::vector<double>& x_all,
                     const std::vector<double>& bias, const std::vector<double>& rw) {
  const int e_all = static_cast<int>(x_all.size());
  const int n = e_all - r.num_shared;
  const int k = r.top_k;
  const bool higher = r.ties == TieBreak::kHigherIndex;
  std::vector<double> x(x_all.begin(), x_all.begin() + n);
  Ref out;
  switch (r.method) {
    case RoutingMethod::kSoftmaxTopK: {
      const double m = *std::max_element(x.begin(), x.end());
      std::vector<double> p(n);
      double sum = 0;
      for (int e = 0; e < n; ++e) sum += (p[e] = std::exp(x[e] - m));
      for (double& v : p) v /= sum;
      const std::vector<int> order = ranked(p, higher);
      for (int j = 0; j < k; ++j) {
        out.ids.push_back(order[j]);
        out.w.push_back(p[order[j]]);
      }
      if (r.normalize) renorm_ref(&out.w);
      break;
    }
    case RoutingMethod::kTopKSoftmax: {
      const std::vector<int> order = ranked(x, higher);
      const double m = x[order[0]];
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += std::exp(x[order[j]] - m);
      for (int j = 0; j < k; ++j) {
        out.ids.push_back(order[j]);
        out.w.push_back(std::exp(x[order[j]] - m) / sum);
      }
      break;
    }
    case RoutingMethod::kSparseMixer: {
      const double two_eps = 2.0 * static_cast<double>(r.sparse_mixer_eps);
      std::vector<double> scores = x;
      for (int j = 0; j < 2; ++j) {
        const int i = ranked(scores, higher)[0];
        const double m = scores[i];
        double sum = 0;
        for (int e = 0; e < n; ++e) {
          const double ratio = (m - x[e]) / std::max(std::fabs(x[e]), m);
          if (x[e] != m) out.margin = std::min(out.margin, std::fabs(ratio - two_eps));
          if (ratio > two_eps || std::isinf(scores[e])) continue;
          sum += std::exp(scores[e] - m);
        }
        out.ids.push_back(i);
        out.w.push_back(1.0 / sum);
        scores[i] = -std::numeric_limits<double>::infinity();
      }
      break;
    }
    case RoutingMethod::kGroupedTopK: {
      std::vector<double> s(n), c(n);
      for (int e = 0; e < n; ++e) {
        s[e] = sigmoid_ref(x[e]);
        c[e] = s[e] + bias[e];
      }
      const int size = n / r.n_group;
      std::vector<double> score(r.n_group);
      for (int g = 0; g < r.n_group; ++g) {
        std::vector<double> grp(c.begin() + g * size, c.begin() + (g + 1) * size);
        std::sort(grp.rbegin(), grp.rend());
        score[g] = size == 1 ? grp[0] : grp[0] + grp[1];
      }
      std::vector<double> sorted_scores = score;
      std::sort(sorted_scores.begin(), sorted_scores.end());
      for (size_t i = 1; i < sorted_scores.size(); ++i) {
        out.margin = std::min(out.margin, sorted_scores[i] - sorted_scores[i - 1]);
      }
      const std::vector<int> groups = ranked(score, higher);
      std::vector<double> masked(n, -std::numeric_limits<double>::infinity());
      for (int j = 0; j < r.topk_group; ++j) {
        for (int e = groups[j] * size; e < (groups[j] + 1) * size; ++e) masked[e] = c[e];
      }
      const std::vector<int> order = ranked(masked, higher);
      double sum = 0;
      for (int j = 0; j < k; ++j) {
        out.ids.push_back(order[j]);
        out.w.push_back(s[order[j]]);
        sum += s[order[j]];
      }
      for (double& v : out.w) {
        if (r.normalize) v /= (sum + 1e-20);
        v *= r.routed_scaling_factor;
      }
      break;
    }
    case RoutingMethod::kTopKSigmoid: {
      const std::vector<int> order = ranked(x, higher);
      for (int j = 0; j < k; ++j) {
        out.ids.push_back(order[j]);
        out.w.push_back(sigmoid_ref(x[order[j]]));
      }
      if (r.normalize) renorm_ref(&out.w);
      break;
    }
  }
  if (!rw.empty()) {
    for (int j = 0; j < k; ++j) out.w[j] = rw[out.ids[j]];
    if (r.normalize) renorm_ref(&out.w);
    if (r.method == RoutingMethod::kGroupedTopK) {
      for (double& v : out.w) v *= r.routed_scaling_factor;
    }
  }
  for (int i = 0; i < r.num_shared; ++i) {
    out.ids.push_back(n + i);
    out.w.push_back(r.shared_weight == SharedWeight::kOne ? 1.0 : sigmoid_ref(x_all[n + i]));
  }
  return out;
}

inline std::vector<double> row(const std::vector<float>& v, int64_t t, int64_t e) {
  return std::vector<double>(v.begin() + t * e, v.begin() + (t + 1) * e);
}

// Compares every token of `got` with the reference; ids bitwise, weights at kWeightRtol.
inline void expect_matches_reference(const LayerSpec& spec, const std::vector<float>& logits,
                                     const Routed& got, const std::vector<double>& bias = {},
                                     const std::vector<float>& rw = {}) {
  ASSERT_TRUE(got.status.is_ok()) << got.status.message();
  const int64_t e = spec.num_experts;
  const int slots = spec.slots();
  const int64_t tokens = static_cast<int64_t>(logits.size()) / e;
  ASSERT_EQ(got.tokens, tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    const Ref ref = reference(spec.routing, row(logits, t, e), bias,
                              rw.empty() ? std::vector<double>() : row(rw, t, e));
    for (int j = 0; j < slots; ++j) {
      ASSERT_EQ(got.ids[t * slots + j], ref.ids[j]) << "token " << t << " slot " << j;
      EXPECT_NEAR(got.w[t * slots + j], ref.w[j], kWeightRtol * std::fabs(ref.w[j]))
          << "token " << t << " slot " << j;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Grouped top-k inputs

// Logits and a bias whose c = s + bias are spaced (a shuffled lattice with jitter), with the group
// scores redrawn until no two lie within 1e-5.
inline void grouped_inputs(const RoutingSpec& r, int64_t e, int64_t tokens, std::mt19937_64& rng,
                           std::vector<float>* logits, std::vector<float>* bias) {
  const int64_t n = e - r.num_shared;
  std::normal_distribution<float> gauss(0.0f, 2.0f);
  // One bias for the layer: c targets for the first token; later tokens get their own logits.
  bias->assign(n, 0.0f);
  logits->clear();
  std::vector<int> perm(n);
  std::uniform_real_distribution<double> jitter(-0.25, 0.25);
  for (int64_t t = 0; t < tokens;) {
    std::vector<float> x(e);
    for (float& v : x) v = gauss(rng);
    if (t == 0) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t i = 0; i < n; ++i) {
        const double c = (perm[i] + jitter(rng)) * (2.0 / n);
        (*bias)[i] = static_cast<float>(c - sigmoid_ref(x[i]));
      }
    }
    const std::vector<double> bd(bias->begin(), bias->end());
    std::vector<double> xd(x.begin(), x.end());
    // Later tokens: the bias is fixed, so spacing in c comes from their logits; require the
    // c values to be spaced too.
    std::vector<double> c(n);
    for (int64_t i = 0; i < n; ++i) c[i] = sigmoid_ref(xd[i]) + bd[i];
    std::vector<double> cs = c;
    std::sort(cs.begin(), cs.end());
    double c_gap = std::numeric_limits<double>::infinity();
    for (int64_t i = 1; i < n; ++i) c_gap = std::min(c_gap, cs[i] - cs[i - 1]);
    if (reference(r, xd, bd, {}).margin > 1e-5 && c_gap > 1e-5) {
      logits->insert(logits->end(), x.begin(), x.end());
      ++t;
    }
  }
}

}  // namespace qmoe::routing_test

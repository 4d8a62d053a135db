// Routing: every method against a plainly written fp64 reference on fresh random inputs, the
// exact rules (ties, renormalization thresholds, shared experts, router_weights), exp_f32's
// accuracy, the expert maps against std::stable_sort, the maps' byte layout, and every error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/routing/route_token.h"
#include "qmoe/routing.h"
#include "test_util.h"

namespace qmoe {
namespace {

using test::fresh_seed;

constexpr double kWeightRtol = 1e-6;

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

Routed run_route(const LayerSpec& spec, const TensorView& logits, const TensorView& rw = {},
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

LayerSpec make_spec(RoutingMethod method, int64_t experts, int top_k, bool normalize = false,
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
std::vector<float> spaced_logits(int64_t tokens, int64_t e, std::mt19937_64& rng, float spacing,
                                 float center = 0.0f) {
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

TensorView f32_view(const std::vector<float>& v, int64_t t, int64_t e) {
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
std::vector<int> ranked(const std::vector<double>& v, bool higher) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) {
    if (v[a] != v[b]) return v[a] > v[b];
    return higher ? a > b : a < b;
  });
  return idx;
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void renorm_ref(std::vector<double>* w) {
  double s = 0;
  for (double v : *w) s += v;
  if (s <= 1e-6) return;
  for (double& v : *w) v /= s;
}

// x: the token's E logits; bias: E' (grouped only); rw: the token's E router weights or empty.
Ref reference(const RoutingSpec& r, const std::vector<double>& x_all,
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

std::vector<double> row(const std::vector<float>& v, int64_t t, int64_t e) {
  return std::vector<double>(v.begin() + t * e, v.begin() + (t + 1) * e);
}

// Compares every token of `got` with the reference; ids bitwise, weights at kWeightRtol.
void expect_matches_reference(const LayerSpec& spec, const std::vector<float>& logits,
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
// exp_f32 and sigmoid

double float_ulp(double y) {
  const double kMinNormal = std::ldexp(1.0, -126);
  if (y < kMinNormal) return std::ldexp(1.0, -149);
  int ex;
  std::frexp(y, &ex);  // y = m 2^ex, m in [0.5, 1)
  return std::ldexp(1.0, ex - 24);
}

TEST(ExpF32, MaxUlpErrorOverSoftmaxRangeAndBeyond) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> xs;
  const int kSweep = 1 << 20;
  for (int i = 0; i <= kSweep; ++i) xs.push_back(-104.0f + 192.0f * static_cast<float>(i) / kSweep);
  std::uniform_real_distribution<float> any(-104.0f, 88.0f), small(-1e-3f, 1e-3f);
  for (int i = 0; i < 100000; ++i) xs.push_back(any(rng));
  for (int i = 0; i < 20000; ++i) xs.push_back(small(rng));
  double max_ulp = 0;
  float worst = 0;
  for (float x : xs) {
    const double exact = std::exp(static_cast<double>(x));
    const double got = routing::exp_f32(x);
    const double ulp = std::fabs(got - exact) / float_ulp(exact);
    if (ulp > max_ulp) {
      max_ulp = ulp;
      worst = x;
    }
  }
  ::testing::Test::RecordProperty("exp_f32_max_ulp", std::to_string(max_ulp));
  std::printf("[exp_f32] max error %.3f ulp at x = %.9g\n", max_ulp, worst);
  // The contract is 2 ulp; an exhaustive run over every float in [-104, 88] measured 0.94, so a
  // result of 1 ulp or more means the polynomial or the reduction changed.
  EXPECT_LT(max_ulp, 1.0) << "at x = " << worst;
}

TEST(ExpF32, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(routing::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(routing::exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(routing::exp_f32(-inf), 0.0f);
  EXPECT_EQ(routing::exp_f32(-110.0f), 0.0f);
  EXPECT_EQ(routing::exp_f32(-1e30f), 0.0f);
  EXPECT_EQ(routing::exp_f32(-std::numeric_limits<float>::max()), 0.0f);
  EXPECT_EQ(routing::exp_f32(89.0f), inf);
  EXPECT_EQ(routing::exp_f32(100.0f), inf);
  EXPECT_EQ(routing::exp_f32(std::numeric_limits<float>::max()), inf);
  EXPECT_EQ(routing::exp_f32(inf), inf);
  EXPECT_TRUE(std::isnan(routing::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  // The largest finite result and the boundary of overflow: ln(FLT_MAX) = 88.7228391...
  EXPECT_TRUE(std::isfinite(routing::exp_f32(88.72283f)));
  EXPECT_EQ(routing::exp_f32(88.7229f), inf);
  // Gradual underflow: exp(-100) = 3.72e-44 is subnormal (about 26.6 units of 2^-149).
  const float sub = routing::exp_f32(-100.0f);
  EXPECT_GT(sub, 0.0f);
  EXPECT_LT(sub, std::numeric_limits<float>::min());
  EXPECT_NEAR(sub, std::exp(-100.0), std::ldexp(1.0, -149));
  // exp(-103.9) = 0.54 units of 2^-149 rounds up to one; exp(-103.98) < 2^-150 rounds to zero.
  EXPECT_EQ(routing::exp_f32(-103.9f), std::ldexp(1.0f, -149));
  EXPECT_EQ(routing::exp_f32(-103.98f), 0.0f);
}

TEST(ExpF32, SigmoidMatchesFp64) {
  std::mt19937_64 rng(fresh_seed());
  std::uniform_real_distribution<float> any(-80.0f, 80.0f);
  double max_rel = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 100000 ? -80.0f + 160.0f * i / 100000.0f : any(rng);
    const double exact = sigmoid_ref(x);
    max_rel = std::max(max_rel, std::fabs(routing::sigmoid_f32(x) - exact) / exact);
  }
  EXPECT_LE(max_rel, 3.0 * std::ldexp(1.0, -24));
  EXPECT_EQ(routing::sigmoid_f32(0.0f), 0.5f);
  EXPECT_EQ(routing::sigmoid_f32(200.0f), 1.0f);
  EXPECT_EQ(routing::sigmoid_f32(-200.0f), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Each method against the reference

struct Shape {
  const char* model;
  int64_t experts;
  int top_k;
  bool normalize;
};

void check_random(RoutingMethod method, const Shape& s, int64_t tokens) {
  SCOPED_TRACE(s.model);
  std::mt19937_64 rng(fresh_seed());
  const LayerSpec spec = make_spec(method, s.experts, s.top_k, s.normalize);
  const std::vector<float> logits = spaced_logits(tokens, s.experts, rng, 0.37f);
  expect_matches_reference(spec, logits, run_route(spec, f32_view(logits, tokens, s.experts)));
}

TEST(Routing, SoftmaxTopKMatchesReference) {
  const Shape shapes[] = {{"Qwen3-30B-A3B: E=128 k=8", 128, 8, true},
                          {"Qwen3-30B-A3B, no renormalization", 128, 8, false},
                          {"GPT-OSS-20B: E=32 k=4", 32, 4, true},
                          {"Qwen1.5-MoE: E=60 k=4", 60, 4, false},
                          {"E=3 k=3", 3, 3, true},
                          {"E=1 k=1", 1, 1, false}};
  for (const Shape& s : shapes) check_random(RoutingMethod::kSoftmaxTopK, s, 37);
}

TEST(Routing, TopKSoftmaxMatchesReference) {
  const Shape shapes[] = {{"Mixtral-8x7B: E=8 k=2", 8, 2, false},
                          {"Qwen3-30B-A3B: E=128 k=8", 128, 8, true},
                          {"E=5 k=5", 5, 5, false}};
  for (const Shape& s : shapes) check_random(RoutingMethod::kTopKSoftmax, s, 37);
}

TEST(Routing, TopKSigmoidMatchesReference) {
  const Shape shapes[] = {{"Llama-4-Scout: E=16 k=1", 16, 1, false},
                          {"Llama-4-Maverick: E=128 k=1", 128, 1, false},
                          {"E=16 k=4, renormalized", 16, 4, true}};
  for (const Shape& s : shapes) check_random(RoutingMethod::kTopKSigmoid, s, 37);
}

TEST(Routing, SparseMixerHandWorked) {
  // eps = 0.01, so an expert stays while (m - x) / max(|x|, m) <= 0.02.
  LayerSpec spec = make_spec(RoutingMethod::kSparseMixer, 4, 2);
  spec.routing.sparse_mixer_eps = 0.01f;
  {
    // First: m = 3 (expert 1); expert 0 ratio 1/3 dropped; experts 2 and 3 (0.03/3, 0.04/3)
    // stay: w1 = 1 / (1 + e^-0.03 + e^-0.04) = 0.341153. Second: expert 1 is out, m = 2.97
    // (expert 2); expert 0 (0.97/2.97) dropped, expert 3 (0.01/2.97) stays:
    // w2 = 1 / (1 + e^-0.01) = 0.502500.
    const std::vector<float> x = {2.0f, 3.0f, 2.97f, 2.96f};
    const Routed got = run_route(spec, f32_view(x, 1, 4));
    ASSERT_TRUE(got.status.is_ok()) << got.status.message();
    EXPECT_EQ(got.ids, (std::vector<int32_t>{1, 2}));
    EXPECT_NEAR(got.w[0], 0.341153, 2e-6);
    EXPECT_NEAR(got.w[1], 0.502500, 2e-6);
  }
  {
    // Negative logits: the factor max(|x|, m) is |x|, not |m|. First: m = -1; expert 1 has
    // 0.0203 / 1.0203 = 0.019896 <= 0.02 and stays (0.0203 / |m| would drop it); 2 and 3 go:
    // w1 = 1 / (1 + e^-0.0203) = 0.505075. Second: m = -1.0203, only expert 1 itself stays: 1.
    const std::vector<float> x = {-1.0f, -1.0203f, -1.5f, -3.0f};
    const Routed got = run_route(spec, f32_view(x, 1, 4));
    ASSERT_TRUE(got.status.is_ok()) << got.status.message();
    EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_NEAR(got.w[0], 0.505075, 2e-6);
    EXPECT_EQ(got.w[1], 1.0f);
  }
  {
    // The second mask uses the original logits against the second maximum: with x = {3, 2.95,
    // 0.5, 1} the first keeps expert 1 (0.05/3 = 0.0167), w1 = 1 / (1 + e^-0.05) = 0.512497;
    // the second, m = 2.95, keeps only expert 1: w2 = 1.
    const std::vector<float> x = {3.0f, 2.95f, 0.5f, 1.0f};
    const Routed got = run_route(spec, f32_view(x, 1, 4));
    ASSERT_TRUE(got.status.is_ok()) << got.status.message();
    EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1}));
    EXPECT_NEAR(got.w[0], 0.512497, 2e-6);
    EXPECT_EQ(got.w[1], 1.0f);
  }
}

TEST(Routing, SparseMixerMatchesReference) {
  std::mt19937_64 rng(fresh_seed());
  // PhiMoE-3.5: E=16 k=2, eps 0.01; a larger eps so that many experts stay in the softmax; logits
  // all negative, or of both signs, where the factor max(|x|, m) is not m.
  struct Case {
    float eps, center, spacing;
  };
  for (const Case c : {Case{0.01f, 4.0f, 0.05f}, Case{0.05f, 4.0f, 0.05f},
                       Case{0.05f, -4.0f, 0.05f}, Case{0.2f, 0.2f, 0.05f}}) {
    LayerSpec spec = make_spec(RoutingMethod::kSparseMixer, 16, 2);
    spec.routing.sparse_mixer_eps = c.eps;
    const int64_t tokens = 29;
    std::vector<float> logits;
    // Logits close to each other relative to their size, so masks cut through the middle.
    // Redraw tokens whose mask decisions lie within 1e-5 of the threshold.
    while (static_cast<int64_t>(logits.size()) < tokens * 16) {
      std::vector<float> cand = spaced_logits(1, 16, rng, c.spacing, c.center);
      const Ref ref = reference(spec.routing, row(cand, 0, 16), {}, {});
      if (ref.margin > 1e-5) logits.insert(logits.end(), cand.begin(), cand.end());
    }
    expect_matches_reference(spec, logits, run_route(spec, f32_view(logits, tokens, 16)));
  }
}

TEST(Routing, GroupedTopKHandWorked) {
  // E' = 8 in 4 groups of 2, keep 2 groups, k = 2. Logits 0 give s = 0.5 exactly; the bias makes
  // c = [0.625 0.5 | 0.8125 0.1875 | 0.75 0.375 | 0.6875 0.625], group scores
  // [1.125, 1.0, 1.125, 1.3125]. Groups kept: 3, then 0 (tied with 2: the lower index). Experts 2
  // and 4 have the largest c but their groups are dropped. Top-2 among {0, 1, 6, 7}: 6 (0.6875),
  // then 0 and 7 tie at 0.625 -> 0. Weights s = 0.5, / (1 + 1e-20) = 0.5, * 2.5 = 1.25.
  LayerSpec spec = make_spec(RoutingMethod::kGroupedTopK, 8, 2, true);
  spec.routing.n_group = 4;
  spec.routing.topk_group = 2;
  spec.routing.routed_scaling_factor = 2.5f;
  const std::vector<float> x(8, 0.0f);
  const std::vector<float> bias = {0.125f, 0.0f,    0.3125f, -0.3125f,
                                   0.25f,  -0.125f, 0.1875f, 0.125f};
  const TensorView bias_view(bias.data(), DType::kF32, {8});
  Routed got = run_route(spec, f32_view(x, 1, 8), {}, bias_view);
  ASSERT_TRUE(got.status.is_ok()) << got.status.message();
  EXPECT_EQ(got.ids, (std::vector<int32_t>{6, 0}));
  EXPECT_EQ(got.w, (std::vector<float>{1.25f, 1.25f}));
  // Ties to the higher index: groups 3 and 2, then experts 4 and 6 (0.75, 0.6875).
  spec.routing.ties = TieBreak::kHigherIndex;
  got = run_route(spec, f32_view(x, 1, 8), {}, bias_view);
  ASSERT_TRUE(got.status.is_ok()) << got.status.message();
  EXPECT_EQ(got.ids, (std::vector<int32_t>{4, 6}));
  // Without renormalization the weights are s * 2.5.
  spec.routing.normalize = false;
  spec.routing.ties = TieBreak::kLowerIndex;
  got = run_route(spec, f32_view(x, 1, 8), {}, bias_view);
  ASSERT_TRUE(got.status.is_ok()) << got.status.message();
  EXPECT_EQ(got.w, (std::vector<float>{1.25f, 1.25f}));
}

// Logits and a bias whose c = s + bias are spaced (a shuffled lattice with jitter), with the group
// scores redrawn until no two lie within 1e-5.
void grouped_inputs(const RoutingSpec& r, int64_t e, int64_t tokens, std::mt19937_64& rng,
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

TEST(Routing, GroupedTopKMatchesReference) {
  std::mt19937_64 rng(fresh_seed());
  struct Case {
    const char* model;
    int64_t experts;
    int top_k, n_group, topk_group, shared;
    bool normalize;
    float scale;
  };
  const Case cases[] = {
      {"DeepSeek-V3: E=256 n_group=8 topk_group=4 k=8, 1 shared", 257, 8, 8, 4, 1, true, 2.5f},
      {"one group (sigmoid + bias top-k): E=64 k=6, no renormalization", 64, 6, 1, 1, 0, false,
       1.0f},
      {"groups of one: E=12 n_group=12 topk_group=5 k=3", 12, 3, 12, 5, 0, true, 1.5f},
      {"k = topk_group * group size: E=16 n_group=4 topk_group=2 k=8", 16, 8, 4, 2, 0, true, 1.0f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    LayerSpec spec =
        make_spec(RoutingMethod::kGroupedTopK, c.experts, c.top_k, c.normalize, c.shared);
    spec.routing.n_group = c.n_group;
    spec.routing.topk_group = c.topk_group;
    spec.routing.routed_scaling_factor = c.scale;
    const int64_t tokens = 17;
    std::vector<float> logits, bias;
    grouped_inputs(spec.routing, c.experts, tokens, rng, &logits, &bias);
    const TensorView bias_view(bias.data(), DType::kF32, {c.experts - c.shared});
    const Routed got = run_route(spec, f32_view(logits, tokens, c.experts), {}, bias_view);
    expect_matches_reference(spec, logits, got, std::vector<double>(bias.begin(), bias.end()));
  }
}

TEST(Routing, GroupedTopKNormalizesTinyWeightsWithEpsilon) {
  // s = sigmoid(-30) ~ 9.4e-14: the sum is far below 1e-6, yet DeepSeek's rule (divide by
  // sum + 1e-20) still normalizes, unlike the skip rule of the other methods.
  LayerSpec spec = make_spec(RoutingMethod::kGroupedTopK, 4, 2, true);
  spec.routing.n_group = 2;
  spec.routing.topk_group = 1;
  const std::vector<float> x = {-30.0f, -31.0f, -32.0f, -33.0f};
  const std::vector<float> bias(4, 0.0f);
  const Routed got =
      run_route(spec, f32_view(x, 1, 4), {}, TensorView(bias.data(), DType::kF32, {4}));
  ASSERT_TRUE(got.status.is_ok()) << got.status.message();
  EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1}));
  const double s0 = sigmoid_ref(-30.0), s1 = sigmoid_ref(-31.0);
  EXPECT_NEAR(got.w[0], s0 / (s0 + s1), 1e-6);
  EXPECT_NEAR(got.w[1], s1 / (s0 + s1), 1e-6);
}

// ---------------------------------------------------------------------------------------------
// The summation order over experts (warp order, route_token.h)

// warp_order_sum() written out as the 32 lanes of a warp run it: lane l's partial over x[l],
// x[l + 32], ... from +0, then the full xor butterfly, every lane adding its partner's partial.
// All lanes must end with the same bits.
float warp_order_sum_by_lanes(const std::vector<float>& x) {
  float lane[32];
  for (int l = 0; l < 32; ++l) {
    lane[l] = 0.0f;
    for (size_t e = l; e < x.size(); e += 32) lane[l] = lane[l] + x[e];
  }
  for (int off = 16; off >= 1; off /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
    std::memcpy(lane, next, sizeof(lane));
  }
  for (int l = 1; l < 32; ++l) {
    EXPECT_EQ(num::f32_bits(lane[l]), num::f32_bits(lane[0])) << "lane " << l;
  }
  return lane[0];
}

float sequential_sum(const std::vector<float>& x) {
  float sum = 0.0f;
  for (float v : x) sum = sum + v;
  return sum;
}

TEST(RoutingOrder, WarpOrderSumIsLanePartialsThenButterfly) {
  std::mt19937_64 rng(fresh_seed());
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int differs = 0, cases = 0;
  for (int n : {1, 2, 5, 31, 32, 33, 60, 64, 127, 128, 255, 257, 512, 1000, 4096}) {
    for (int rep = 0; rep < 8; ++rep) {
      // Softmax-like terms over a wide range, so that the order shows in the last bits.
      std::vector<float> x(n);
      for (float& v : x) v = routing::exp_f32(-12.0f * unit(rng));
      const float got = routing::warp_order_sum(x.data(), n);
      ASSERT_EQ(num::f32_bits(got), num::f32_bits(warp_order_sum_by_lanes(x))) << "n = " << n;
      differs += num::f32_bits(got) != num::f32_bits(sequential_sum(x));
      ++cases;
    }
  }
  // The order is not the sequential one: on these inputs most large sums differ in their bits.
  EXPECT_GT(differs, cases / 4);
  // A case worked by hand: 2^24 then 32 ones. Sequentially every 1 is lost to rounding (2^24 + 1
  // ties to the even 2^24). In warp order lane 0 loses x[32] that way, and at step 16 the 1 of
  // lane 16; then lane 0 adds the partials 2, 4, 8 and 16 of the other lanes, each exactly:
  // 2^24 + 30.
  std::vector<float> x(33, 1.0f);
  x[0] = 16777216.0f;
  EXPECT_EQ(sequential_sum(x), 16777216.0f);
  EXPECT_EQ(routing::warp_order_sum(x.data(), 33), 16777246.0f);
  EXPECT_EQ(routing::warp_order_sum(x.data(), 0), 0.0f);
}

// softmax_top_k's denominator and the sparse mixer's sums run in warp order: a token whose
// weights differ between the two orders gets the warp-order bits from route().
TEST(RoutingOrder, SoftmaxAndSparseMixerSumInWarpOrder) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t e = 128;
  bool softmax_seen = false, mixer_seen = false;
  for (int attempt = 0; attempt < 200 && !(softmax_seen && mixer_seen); ++attempt) {
    const std::vector<float> x = test::gaussian(e, rng(), 2.0f);
    // softmax_top_k, k = 1: w = p of the maximum = exp(0) / sum = 1 / sum.
    {
      const float m = *std::max_element(x.begin(), x.end());
      std::vector<float> p(e);
      for (int64_t i = 0; i < e; ++i) p[i] = routing::exp_f32(x[i] - m);
      const float warp = 1.0f / warp_order_sum_by_lanes(p);
      const float seq = 1.0f / sequential_sum(p);
      const Routed got = run_route(make_spec(RoutingMethod::kSoftmaxTopK, e, 1), f32_view(x, 1, e));
      ASSERT_TRUE(got.status.is_ok()) << got.status.message();
      EXPECT_EQ(num::f32_bits(got.w[0]), num::f32_bits(warp));
      softmax_seen = softmax_seen || warp != seq;
    }
    // The sparse mixer's first weight: 1 / (sum of the kept terms), eps large enough to keep many.
    {
      LayerSpec spec = make_spec(RoutingMethod::kSparseMixer, e, 2);
      spec.routing.sparse_mixer_eps = 0.5f;
      const Routed got = run_route(spec, f32_view(x, 1, e));
      ASSERT_TRUE(got.status.is_ok()) << got.status.message();
      const float m = x[got.ids[0]];
      std::vector<float> terms(e);
      for (int64_t i = 0; i < e; ++i) {
        terms[i] = routing::sparse_mixer_term(m, x[i], 2.0f * spec.routing.sparse_mixer_eps);
      }
      const float warp = 1.0f / warp_order_sum_by_lanes(terms);
      EXPECT_EQ(num::f32_bits(got.w[0]), num::f32_bits(warp));
      mixer_seen = mixer_seen || warp != 1.0f / sequential_sum(terms);
    }
  }
  // Otherwise the checks above could not tell the orders apart.
  EXPECT_TRUE(softmax_seen);
  EXPECT_TRUE(mixer_seen);
}

// ---------------------------------------------------------------------------------------------
// Exact rules

TEST(Routing, EqualLogitsTieToLowerIndexOrHigherWhenAsked) {
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                          RoutingMethod::kTopKSigmoid, RoutingMethod::kSparseMixer}) {
    SCOPED_TRACE(routing_method_name(m));
    LayerSpec spec = make_spec(m, 6, 2);
    // Experts 1, 2 and 4 share the maximum; 3 is next.
    const std::vector<float> x = {0.5f, 2.0f, 2.0f, 1.0f, 2.0f, -1.0f};
    Routed got = run_route(spec, f32_view(x, 1, 6));
    ASSERT_TRUE(got.status.is_ok()) << got.status.message();
    EXPECT_EQ(got.ids, (std::vector<int32_t>{1, 2}));
    // The sparse mixer's second softmax runs without the first pick, so its weights differ.
    if (m != RoutingMethod::kSparseMixer) {
      EXPECT_EQ(got.w[0], got.w[1]);
    }
    spec.routing.ties = TieBreak::kHigherIndex;
    got = run_route(spec, f32_view(x, 1, 6));
    ASSERT_TRUE(got.status.is_ok()) << got.status.message();
    EXPECT_EQ(got.ids, (std::vector<int32_t>{4, 2}));
  }
  // All equal, k = E: every expert once, in index order (reversed for kHigherIndex).
  LayerSpec spec = make_spec(RoutingMethod::kSoftmaxTopK, 5, 5);
  const std::vector<float> x(5, 0.25f);
  Routed got = run_route(spec, f32_view(x, 1, 5));
  ASSERT_TRUE(got.status.is_ok());
  EXPECT_EQ(got.ids, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  for (float w : got.w) EXPECT_EQ(w, 0.2f);
  spec.routing.ties = TieBreak::kHigherIndex;
  got = run_route(spec, f32_view(x, 1, 5));
  EXPECT_EQ(got.ids, (std::vector<int32_t>{4, 3, 2, 1, 0}));
}

TEST(Routing, LargeLogitsDoNotOverflow) {
  // exp(200) overflows fp32: the softmaxes must subtract their maximum first; differences of
  // +-3e30 must give weights 0 and 1, not NaN.
  const std::vector<float> x = {150.0f, 200.0f, -300.0f, 199.0f, 3e30f, -3e30f};
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                          RoutingMethod::kTopKSigmoid, RoutingMethod::kSparseMixer}) {
    SCOPED_TRACE(routing_method_name(m));
    const LayerSpec spec = make_spec(m, 6, 2, true);
    const Routed got = run_route(spec, f32_view(x, 1, 6));
    expect_matches_reference(spec, x, got);
    for (float w : got.w) EXPECT_TRUE(std::isfinite(w));
    EXPECT_EQ(got.ids[0], 4);
  }
}

TEST(Routing, RenormalizationSkippedWhenSumIsTiny) {
  // Llama-4 style weights sigmoid(-30) + sigmoid(-31) ~ 1.4e-13 <= 1e-6: left as they are.
  LayerSpec spec = make_spec(RoutingMethod::kTopKSigmoid, 4, 2, true);
  const std::vector<float> x = {-32.0f, -30.0f, -33.0f, -31.0f};
  Routed got = run_route(spec, f32_view(x, 1, 4));
  ASSERT_TRUE(got.status.is_ok());
  EXPECT_EQ(got.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(got.w[0], routing::sigmoid_f32(-30.0f));
  EXPECT_EQ(got.w[1], routing::sigmoid_f32(-31.0f));
  // Gathered router weights: 4e-7 + 5e-7 <= 1e-6 is kept raw; 4e-7 + 7e-7 > 1e-6 is normalized.
  spec = make_spec(RoutingMethod::kSoftmaxTopK, 4, 2, true);
  const std::vector<float> logits = {0.0f, 3.0f, 2.0f, 1.0f};
  std::vector<float> rw = {9.0f, 4e-7f, 5e-7f, 9.0f};
  got = run_route(spec, f32_view(logits, 1, 4), f32_view(rw, 1, 4));
  ASSERT_TRUE(got.status.is_ok());
  EXPECT_EQ(got.ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(got.w, (std::vector<float>{4e-7f, 5e-7f}));
  rw[2] = 7e-7f;
  got = run_route(spec, f32_view(logits, 1, 4), f32_view(rw, 1, 4));
  ASSERT_TRUE(got.status.is_ok());
  EXPECT_NEAR(got.w[0], 4.0 / 11.0, 1e-6);
  EXPECT_NEAR(got.w[1], 7.0 / 11.0, 1e-6);
}

TEST(Routing, SharedExpertsAreAlwaysOnWithSigmoidWeight) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t e = 10, tokens = 23;
  for (RoutingMethod m :
       {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax, RoutingMethod::kTopKSigmoid}) {
    SCOPED_TRACE(routing_method_name(m));
    const LayerSpec spec = make_spec(m, e, 3, true, 2);
    std::vector<float> logits = spaced_logits(tokens, e, rng, 0.37f);
    // The shared columns get the largest logits: they must not enter top-k or the softmax.
    for (int64_t t = 0; t < tokens; ++t) {
      logits[t * e + 8] = 9.0f + 0.1f * t;
      logits[t * e + 9] = -0.3f * t;
    }
    const Routed got = run_route(spec, f32_view(logits, tokens, e));
    expect_matches_reference(spec, logits, got);
    for (int64_t t = 0; t < tokens; ++t) {
      EXPECT_EQ(got.ids[t * 5 + 3], 8);
      EXPECT_EQ(got.ids[t * 5 + 4], 9);
      EXPECT_EQ(got.w[t * 5 + 3], routing::sigmoid_f32(logits[t * e + 8]));
    }
  }
}

// The weight-1 rule (DeepSeek-V3, Llama-4): the shared slots weigh exactly 1 whatever their
// logits (which are read by nothing else), and the routed slots are bitwise those of the sigmoid
// rule.
TEST(Routing, SharedExpertsWithWeightOne) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t e = 10, tokens = 23;
  for (RoutingMethod m :
       {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax, RoutingMethod::kTopKSigmoid}) {
    SCOPED_TRACE(routing_method_name(m));
    const LayerSpec sigmoid_spec = make_spec(m, e, 3, true, 2);
    LayerSpec spec = sigmoid_spec;
    spec.routing.shared_weight = SharedWeight::kOne;
    std::vector<float> logits = spaced_logits(tokens, e, rng, 0.37f);
    for (int64_t t = 0; t < tokens; ++t) {
      logits[t * e + 8] = -40.0f + 3.0f * t;  // sigmoid from 4e-18 to ~1
      logits[t * e + 9] = 0.5f * t;
    }
    const Routed got = run_route(spec, f32_view(logits, tokens, e));
    const Routed sig = run_route(sigmoid_spec, f32_view(logits, tokens, e));
    expect_matches_reference(spec, logits, got);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int j = 0; j < 5; ++j) EXPECT_EQ(got.ids[t * 5 + j], sig.ids[t * 5 + j]);
      for (int j = 0; j < 3; ++j)
        EXPECT_EQ(num::f32_bits(got.w[t * 5 + j]), num::f32_bits(sig.w[t * 5 + j]));
      EXPECT_EQ(got.w[t * 5 + 3], 1.0f);
      EXPECT_EQ(got.w[t * 5 + 4], 1.0f);
    }
  }
}

TEST(Routing, RouterWeightsAreGathered) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t e = 32, tokens = 19;
  std::uniform_real_distribution<float> pos(0.01f, 1.0f);
  std::vector<float> rw(tokens * e);
  for (float& v : rw) v = pos(rng);
  for (bool normalize : {false, true}) {
    SCOPED_TRACE(normalize ? "normalize" : "raw");
    const LayerSpec spec = make_spec(RoutingMethod::kSoftmaxTopK, e, 4, normalize, 1);
    const std::vector<float> logits = spaced_logits(tokens, e, rng, 0.37f);
    const Routed plain = run_route(spec, f32_view(logits, tokens, e));
    const Routed got = run_route(spec, f32_view(logits, tokens, e), f32_view(rw, tokens, e));
    expect_matches_reference(spec, logits, got, {}, rw);
    EXPECT_EQ(got.ids, plain.ids);  // selection unchanged
    if (!normalize) {
      for (int64_t t = 0; t < tokens; ++t) {
        for (int j = 0; j < 4; ++j) EXPECT_EQ(got.w[t * 5 + j], rw[t * e + got.ids[t * 5 + j]]);
      }
    }
  }
  // Grouped top-k still applies its scaling factor to the gathered weights.
  LayerSpec spec = make_spec(RoutingMethod::kGroupedTopK, e, 4, true);
  spec.routing.n_group = 4;
  spec.routing.topk_group = 2;
  spec.routing.routed_scaling_factor = 2.5f;
  std::vector<float> logits, bias;
  grouped_inputs(spec.routing, e, tokens, rng, &logits, &bias);
  const Routed got = run_route(spec, f32_view(logits, tokens, e), f32_view(rw, tokens, e),
                               TensorView(bias.data(), DType::kF32, {e}));
  expect_matches_reference(spec, logits, got, std::vector<double>(bias.begin(), bias.end()), rw);
}

// f16 / bf16 logits: routed exactly as their fp32 values, and matching the reference.
TEST(Routing, HalfPrecisionLogits) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t e = 32, tokens = 21;
  for (DType dt : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (RoutingMethod m : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax}) {
      const LayerSpec spec = make_spec(m, e, 4, true);
      const std::vector<float> raw = spaced_logits(tokens, e, rng, 0.37f);
      std::vector<uint16_t> half(raw.size());
      std::vector<float> decoded(raw.size());
      for (size_t i = 0; i < raw.size(); ++i) {
        half[i] = dt == DType::kF16 ? num::f32_to_f16(raw[i]) : num::f32_to_bf16(raw[i]);
        decoded[i] = dt == DType::kF16 ? num::f16_to_f32(half[i]) : num::bf16_to_f32(half[i]);
      }
      const Routed got = run_route(spec, TensorView(half.data(), dt, {tokens, e}));
      const Routed f32 = run_route(spec, f32_view(decoded, tokens, e));
      expect_matches_reference(spec, decoded, got);
      EXPECT_EQ(got.ids, f32.ids);
      EXPECT_EQ(0, std::memcmp(got.w.data(), f32.w.data(), got.w.size() * sizeof(float)));
    }
  }
}

TEST(Routing, DeterministicAndMapsCarvedForMoreTokens) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t e = 64, tokens = 31;
  for (RoutingMethod m :
       {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax, RoutingMethod::kSparseMixer,
        RoutingMethod::kGroupedTopK, RoutingMethod::kTopKSigmoid}) {
    SCOPED_TRACE(routing_method_name(m));
    LayerSpec spec = make_spec(m, e, 2, true, 1);
    spec.routing.n_group = 9;
    spec.routing.topk_group = 3;
    const std::vector<float> logits = test::gaussian(tokens * e, rng(), 3.0f);
    const std::vector<float> bias = test::gaussian(e - 1, rng(), 0.1f);
    const TensorView bv(bias.data(), DType::kF32, {e - 1});
    const Routed a = run_route(spec, f32_view(logits, tokens, e), {}, bv);
    const Routed b = run_route(spec, f32_view(logits, tokens, e), {}, bv, 13);
    ASSERT_TRUE(a.status.is_ok()) << a.status.message();
    ASSERT_TRUE(b.status.is_ok()) << b.status.message();
    EXPECT_EQ(b.tokens, tokens);
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(0, std::memcmp(a.w.data(), b.w.data(), a.w.size() * sizeof(float)));
    EXPECT_EQ(a.counts, b.counts);
    EXPECT_EQ(a.offsets, b.offsets);
    EXPECT_EQ(a.permuted, b.permuted);
    EXPECT_EQ(a.position, b.position);
    // Each token's routed experts are distinct, in range, and not the shared one.
    for (int64_t t = 0; t < tokens; ++t) {
      EXPECT_NE(a.ids[t * 3], a.ids[t * 3 + 1]);
      for (int j = 0; j < 2; ++j) EXPECT_TRUE(a.ids[t * 3 + j] >= 0 && a.ids[t * 3 + j] < e - 1);
      EXPECT_EQ(a.ids[t * 3 + 2], e - 1);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Expert maps and their storage

void expect_maps_match_stable_sort(const std::vector<int32_t>& ids, int64_t e, const Routed& got) {
  const int64_t r = static_cast<int64_t>(ids.size());
  std::vector<int32_t> order(r);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  EXPECT_EQ(got.permuted, order);
  std::vector<int32_t> counts(e, 0);
  for (int32_t id : ids) ++counts[id];
  EXPECT_EQ(got.counts, counts);
  EXPECT_EQ(std::accumulate(got.counts.begin(), got.counts.end(), int64_t{0}), r);
  ASSERT_EQ(static_cast<int64_t>(got.offsets.size()), e + 1);
  EXPECT_EQ(got.offsets[0], 0);
  for (int64_t i = 0; i < e; ++i) EXPECT_EQ(got.offsets[i + 1] - got.offsets[i], counts[i]);
  std::vector<char> seen(r, 0);
  for (int64_t p = 0; p < r; ++p) {
    ASSERT_TRUE(got.permuted[p] >= 0 && got.permuted[p] < r);
    EXPECT_FALSE(seen[got.permuted[p]]) << "position " << p;
    seen[got.permuted[p]] = 1;
    EXPECT_EQ(got.position[got.permuted[p]], p);
  }
  for (int64_t i = 0; i < e; ++i) {
    for (int32_t p = got.offsets[i]; p < got.offsets[i + 1]; ++p)
      EXPECT_EQ(ids[got.permuted[p]], i);
  }
}

TEST(RouteMaps, BuildMatchesStableSort) {
  std::mt19937_64 rng(fresh_seed());
  for (int64_t e : {1, 7, 128}) {
    const int64_t tokens = 53;
    const int slots = 5;
    AlignedBuffer buf(route_maps_bytes(tokens, slots, e));
    RouteMapsView maps = carve_route_maps(buf.data, tokens, slots, e);
    // Skewed ids: half the routes go to a few experts, some experts get none.
    std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(e - 1));
    std::uniform_int_distribution<int32_t> few(0,
                                               static_cast<int32_t>(std::min<int64_t>(e, 3) - 1));
    std::vector<int32_t> ids(tokens * slots);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = (rng() & 1) ? any(rng) : few(rng);
    std::copy(ids.begin(), ids.end(), maps.expert_ids);
    std::fill(maps.expert_counts, maps.expert_counts + e, 12345);  // stale values
    build_expert_maps(&maps);
    Routed got;
    got.counts.assign(maps.expert_counts, maps.expert_counts + e);
    got.offsets.assign(maps.expert_offsets, maps.expert_offsets + e + 1);
    got.permuted.assign(maps.permuted_route, maps.permuted_route + ids.size());
    got.position.assign(maps.route_position, maps.route_position + ids.size());
    expect_maps_match_stable_sort(ids, e, got);
  }
  // And the maps that route() builds.
  const LayerSpec spec = make_spec(RoutingMethod::kTopKSoftmax, 16, 4, false, 1);
  const std::vector<float> logits = test::gaussian(41 * 16, rng());
  const Routed got = run_route(spec, f32_view(logits, 41, 16));
  ASSERT_TRUE(got.status.is_ok());
  expect_maps_match_stable_sort(got.ids, 16, got);
}

TEST(RouteMaps, BytesAndLayoutAreExact) {
  auto up = [](size_t b) { return (b + 63) / 64 * 64; };
  struct Case {
    int64_t tokens;
    int slots;
    int64_t experts;
  };
  for (const Case c :
       {Case{5, 3, 7}, Case{1, 1, 1}, Case{0, 2, 8}, Case{4096, 9, 257}, Case{17, 8, 128}}) {
    const size_t r = static_cast<size_t>(c.tokens) * c.slots;
    const size_t e = static_cast<size_t>(c.experts);
    const size_t sizes[7] = {4 * r, 4 * r, 4 * e, 4 * (e + 1), 4 * r, 4 * r, 8 * e};
    size_t want = 0;
    for (size_t s : sizes) want += up(s);
    const size_t bytes = route_maps_bytes(c.tokens, c.slots, c.experts);
    EXPECT_EQ(bytes, want) << c.tokens << " " << c.slots << " " << c.experts;
    AlignedBuffer buf(bytes);
    const RouteMapsView v = carve_route_maps(buf.data, c.tokens, c.slots, c.experts);
    const char* starts[7] = {
        reinterpret_cast<char*>(v.expert_ids),     reinterpret_cast<char*>(v.weights),
        reinterpret_cast<char*>(v.expert_counts),  reinterpret_cast<char*>(v.expert_offsets),
        reinterpret_cast<char*>(v.permuted_route), reinterpret_cast<char*>(v.route_position),
        reinterpret_cast<char*>(v.scratch)};
    // In order, 64-byte aligned, each with room for its array, the last ending inside the buffer.
    for (int i = 0; i < 7; ++i) {
      ASSERT_NE(starts[i], nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(starts[i]) % 64, 0u);
      const char* end = i < 6 ? starts[i + 1] : buf.data + bytes;
      EXPECT_GE(static_cast<size_t>(end - starts[i]), sizes[i]) << "array " << i;
    }
    EXPECT_EQ(starts[0], buf.data);
    EXPECT_EQ(v.tokens, c.tokens);
    EXPECT_EQ(v.slots, c.slots);
    EXPECT_EQ(v.experts, c.experts);
  }
  // Hand-computed: T=5, slots=3, E=7 -> 60, 60, 28, 32, 60, 60, 56 bytes, each padded to 64.
  EXPECT_EQ(route_maps_bytes(5, 3, 7), 7u * 64u);
  EXPECT_EQ(route_maps_bytes(-1, 3, 7), 0u);
  EXPECT_EQ(route_maps_bytes(int64_t{1} << 30, 2, 7), 0u);
  // A misaligned or null buffer gives null arrays.
  AlignedBuffer buf(route_maps_bytes(5, 3, 7) + 64);
  EXPECT_EQ(carve_route_maps(buf.data + 4, 5, 3, 7).expert_ids, nullptr);
  EXPECT_EQ(carve_route_maps(nullptr, 5, 3, 7).weights, nullptr);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(Routing, InvalidInputsNameTheArgument) {
  const int64_t e = 8, tokens = 4;
  const std::vector<float> logits = test::gaussian(tokens * e, fresh_seed());
  const std::vector<float> bias(e, 0.0f);
  const LayerSpec base = make_spec(RoutingMethod::kSoftmaxTopK, e, 2, true);
  LayerSpec grouped = make_spec(RoutingMethod::kGroupedTopK, e, 2, true);
  grouped.routing.n_group = 4;
  grouped.routing.topk_group = 2;
  const TensorView good = f32_view(logits, tokens, e);
  const TensorView good_bias(bias.data(), DType::kF32, {e});
  ASSERT_TRUE(run_route(base, good).status.is_ok());
  ASSERT_TRUE(run_route(grouped, good, {}, good_bias).status.is_ok());

  auto expect_error = [](const Routed& r, const std::string& name, const char* what) {
    SCOPED_TRACE(what);
    ASSERT_FALSE(r.status.is_ok());
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find(name), std::string::npos) << r.status.message();
  };
  auto spec_error = [&](LayerSpec s, const std::string& name, const char* what,
                        const TensorView& b = {}) {
    expect_error(run_route(s, good, {}, b), name, what);
  };
  LayerSpec s = base;
  s.routing.top_k = 0;
  spec_error(s, "routing.top_k", "top_k 0");
  s.routing.top_k = -3;
  spec_error(s, "routing.top_k", "top_k negative");
  s.routing.top_k = 9;
  spec_error(s, "routing.top_k", "top_k > E");
  s = base;
  s.routing.num_shared = 7;  // E' = 1 < k
  spec_error(s, "routing.top_k", "top_k > E - num_shared");
  s.routing.num_shared = -1;
  spec_error(s, "routing.num_shared", "num_shared negative");
  s.routing.num_shared = 8;
  spec_error(s, "routing.num_shared", "num_shared = E");
  s = base;
  s.routing.shared_weight = static_cast<SharedWeight>(7);
  spec_error(s, "routing.shared_weight", "unknown shared weight rule");
  s = base;
  s.num_experts = 0;
  expect_error(run_route(s, TensorView(logits.data(), DType::kF32, {tokens, 0})), "num_experts",
               "no experts");
  s = base;
  s.routing.method = static_cast<RoutingMethod>(42);
  spec_error(s, "routing.method", "unknown method");
  s = base;
  s.routing.ties = static_cast<TieBreak>(7);
  spec_error(s, "routing.ties", "unknown tie rule");

  s = make_spec(RoutingMethod::kSparseMixer, e, 3);
  spec_error(s, "routing.top_k", "sparse mixer k = 3");
  s.routing.top_k = 2;
  s.routing.sparse_mixer_eps = std::nanf("");
  spec_error(s, "routing.sparse_mixer_eps", "eps nan");
  s.routing.sparse_mixer_eps = -0.5f;
  spec_error(s, "routing.sparse_mixer_eps", "eps negative");

  s = grouped;
  s.routing.n_group = 3;
  spec_error(s, "routing.n_group", "n_group does not divide", good_bias);
  s.routing.n_group = 0;
  spec_error(s, "routing.n_group", "n_group 0", good_bias);
  s = grouped;
  s.routing.topk_group = 0;
  spec_error(s, "routing.topk_group", "topk_group 0", good_bias);
  s.routing.topk_group = 5;
  spec_error(s, "routing.topk_group", "topk_group > n_group", good_bias);
  s = grouped;
  s.routing.top_k = 5;  // 2 groups of 2 reachable
  spec_error(s, "routing.top_k", "k > topk_group * group size", good_bias);
  s = grouped;
  s.routing.routed_scaling_factor = std::numeric_limits<float>::infinity();
  spec_error(s, "routing.routed_scaling_factor", "scale inf", good_bias);
  spec_error(grouped, "router_correction_bias", "bias absent");
  spec_error(grouped, "router_correction_bias", "bias short",
             TensorView(bias.data(), DType::kF32, {e - 1}));
  spec_error(grouped, "router_correction_bias", "bias f16",
             TensorView(bias.data(), DType::kF16, {e}));
  spec_error(grouped, "router_correction_bias", "bias rank 2",
             TensorView(bias.data(), DType::kF32, {1, e}));
  std::vector<float> bad_bias = bias;
  bad_bias[2] = std::nanf("");
  const Routed bb = run_route(grouped, good, {}, TensorView(bad_bias.data(), DType::kF32, {e}));
  expect_error(bb, "router_correction_bias", "bias nan");
  EXPECT_EQ(bb.status.message(), "router_correction_bias: non-finite value nan at expert 2");

  expect_error(run_route(base, TensorView()), "router_probs", "logits absent");
  expect_error(run_route(base, TensorView(logits.data(), DType::kI32, {tokens, e})), "router_probs",
               "logits i32");
  expect_error(run_route(base, TensorView(logits.data(), DType::kF32, {tokens, e - 1})),
               "router_probs", "logits E - 1 columns");
  expect_error(run_route(base, TensorView(logits.data(), DType::kF32, {tokens * e})),
               "router_probs", "logits rank 1");
  expect_error(run_route(base, TensorView(logits.data(), DType::kF32, {1, tokens, e})),
               "router_probs", "logits rank 3");
  // Too many routes for int32 ids: rejected from the shape alone, before any data is read.
  {
    AlignedBuffer buf(route_maps_bytes(tokens, 2, e));
    RouteMapsView maps = carve_route_maps(buf.data, tokens, 2, e);
    RunInputs in;
    in.router_logits = TensorView(logits.data(), DType::kF32, {int64_t{1} << 30, e});
    const Status st = route(base, in, {}, &maps);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("router_probs"), std::string::npos) << st.message();
  }
  for (float bad : {-std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(),
                    std::nanf("")}) {
    std::vector<float> l = logits;
    l[3 * e + 5] = bad;
    const Routed r = run_route(base, f32_view(l, tokens, e));
    expect_error(r, "router_probs", "non-finite logit");
    const std::string v = std::isnan(bad) ? "nan" : (bad > 0 ? "inf" : "-inf");
    EXPECT_EQ(r.status.message(), "router_probs: non-finite value " + v + " at token 3, expert 5");
  }
  {
    std::vector<uint16_t> h(tokens * e, num::f32_to_f16(1.0f));
    h[2 * e + 6] = 0x7C00;  // f16 +inf
    expect_error(run_route(base, TensorView(h.data(), DType::kF16, {tokens, e})),
                 "router_probs: non-finite value inf at token 2, expert 6", "f16 inf logit");
  }
  std::vector<float> rw(tokens * e, 0.5f);
  expect_error(run_route(base, good, TensorView(rw.data(), DType::kF32, {tokens - 1, e})),
               "router_weights", "router_weights short");
  expect_error(run_route(base, good, TensorView(rw.data(), DType::kI8, {tokens, e})),
               "router_weights", "router_weights i8");
  rw[1 * e + 2] = std::numeric_limits<float>::infinity();
  expect_error(run_route(base, good, f32_view(rw, tokens, e)),
               "router_weights: non-finite value inf at token 1, expert 2", "router_weights inf");

  // Maps: null, not carved, too few tokens, other slots or experts.
  RunInputs in;
  in.router_logits = good;
  EXPECT_NE(route(base, in, {}, nullptr).message().find("maps"), std::string::npos);
  RouteMapsView empty;
  EXPECT_NE(route(base, in, {}, &empty).message().find("maps"), std::string::npos);
  struct Carve {
    int64_t tokens;
    int slots;
    int64_t experts;
  };
  for (const Carve c : {Carve{tokens - 1, 2, e}, Carve{tokens, 3, e}, Carve{tokens, 2, e + 1}}) {
    AlignedBuffer buf(route_maps_bytes(c.tokens, c.slots, c.experts));
    RouteMapsView maps = carve_route_maps(buf.data, c.tokens, c.slots, c.experts);
    const Status st = route(base, in, {}, &maps);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("maps: carved for"), std::string::npos) << st.message();
  }
}

TEST(Routing, ZeroTokens) {
  const LayerSpec spec = make_spec(RoutingMethod::kSoftmaxTopK, 8, 2);
  const float dummy = 0.0f;
  const Routed got = run_route(spec, TensorView(&dummy, DType::kF32, {0, 8}));
  ASSERT_TRUE(got.status.is_ok()) << got.status.message();
  EXPECT_EQ(got.counts, std::vector<int32_t>(8, 0));
  EXPECT_EQ(got.offsets, std::vector<int32_t>(9, 0));
}

}  // namespace
}  // namespace qmoe

// Routing: every method against a plainly written fp64 reference on fresh random inputs (the
// reference is in routing_test_util.h), exp_f32's accuracy, and the warp order of the sums over
// experts. The exact rules, the expert maps and every error are in test_routing_rules.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "core/routing/route_token.h"
#include "qmoe/routing.h"
#include "routing_test_util.h"
#include "test_util.h"

namespace qmoe {
namespace {

using namespace routing_test;
using test::fresh_seed;

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

}  // namespace
}  // namespace qmoe

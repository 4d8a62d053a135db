// Routing's exact rules (ties, overflow, renormalization thresholds, shared experts,
// router_weights, half-precision logits, determinism), the expert maps against std::stable_sort,
// the maps' byte layout, and every error. The reference and the helpers are in
// routing_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
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

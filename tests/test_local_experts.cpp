// Local experts (LayerSpec::first_expert, local_experts): a layer that holds experts
// [first, first + L) of E routes over all E and returns its partial sum. R shards run in turn add
// up to the whole layer (CPU backend and oracle), a fixed sharding is bitwise reproducible across
// thread counts, and bad ranges are refused naming the field.
//
// Every shard's weights are views into one whole layer's tensors (make_shard, layer_factory.h).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "layer_factory.h"
#include "qmoe/io.h"
#include "qmoe/ort.h"

namespace qmoe::test {
namespace {

// Runs the CPU backend; out receives the output as floats (act dtype f32 in these tests).
void run_cpu(const LayerSpec& spec, const LayerWeights& w, const RunInputs& in, int threads,
             std::vector<float>* out) {
  std::unique_ptr<PreparedLayer> layer;
  PrepareOptions opt;
  opt.num_threads = threads;
  Status st = prepare_layer(BackendKind::kCpu, spec, w, opt, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const int64_t t = in.input.dims[0];
  out->assign(static_cast<size_t>(t * spec.hidden), std::nanf(""));
  MutableTensorView ov(out->data(), DType::kF32, {t, spec.hidden});
  st = run_layer(*layer, in, ov);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
}

// Splits E experts into `bounds` (shard r holds [bounds[r], bounds[r + 1])) and checks that the
// shards' outputs add up to the whole layer's, for the CPU backend and the oracle.
void check_shards_sum(const LayerSpec& spec, const std::vector<int64_t>& bounds, int64_t tokens,
                      bool router_weights = false) {
  const uint64_t seed = fresh_seed();
  TestLayer whole;
  make_layer(spec, seed, &whole);
  TestInputs ti;
  make_inputs(spec, tokens, seed, router_weights, &ti);

  std::vector<float> whole_cpu;
  run_cpu(spec, whole.weights, ti.in, 2, &whole_cpu);
  std::vector<double> whole_ref;
  Status st = reference_forward(spec, whole.weights, ti.in, &whole_ref);
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  const size_t n = whole_ref.size();
  std::vector<double> sum_cpu(n, 0.0), sum_ref(n, 0.0);
  int nonzero_shards = 0;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    const TestLayer sh = make_shard(whole, bounds[r], bounds[r + 1] - bounds[r]);
    std::vector<float> part;
    run_cpu(sh.spec, sh.weights, ti.in, 2, &part);
    std::vector<double> part_ref;
    st = reference_forward(sh.spec, sh.weights, ti.in, &part_ref);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(part_ref.size(), n);
    // Each partial matches the oracle's partial on its own.
    EXPECT_LE(rel_norm(part.data(), part_ref.data(), n), 1e-5) << "shard " << r;
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      sum_cpu[i] += part[i];
      sum_ref[i] += part_ref[i];
      any = any || part[i] != 0.0f;
    }
    nonzero_shards += any;
  }
  // A partial that is all of the layer (or none of it) would make the sums trivially equal; with
  // several tokens every shard gets routes (one token may land in a single shard).
  if (tokens >= 8) EXPECT_GE(nonzero_shards, 2);
  EXPECT_LE(rel_norm(sum_ref.data(), whole_ref.data(), n), 1e-12);
  EXPECT_LE(rel_norm(sum_cpu.data(), whole_ref.data(), n), 1e-5);
  EXPECT_LE(rel_norm(sum_cpu.data(), whole_cpu.data(), n), 1e-5);
}

class LocalExpertsFormat : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(LocalExpertsFormat, ShardsSumToTheWholeLayer) {
  LayerSpec s = small_spec(GetParam());
  s.has_fc1_bias = s.has_fc2_bias = true;  // biases are per expert: sliced with the weights
  check_shards_sum(s, {0, 3, 5, 8}, 24);
  check_shards_sum(s, {0, 4, 8}, 1);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, LocalExpertsFormat,
                         ::testing::Values(WeightFormat::kInt2, WeightFormat::kInt3,
                                           WeightFormat::kInt4, WeightFormat::kInt8,
                                           WeightFormat::kNvFp4, WeightFormat::kMxFp4,
                                           WeightFormat::kFp8, WeightFormat::kFp8Block),
                         [](const auto& info) {
                           return std::string(format_info(info.param).name);
                         });

TEST(LocalExperts, EveryRoutingMethod) {
  LayerSpec s = small_spec(WeightFormat::kInt4);
  s.routing.method = RoutingMethod::kTopKSoftmax;
  check_shards_sum(s, {0, 2, 6, 8}, 16);
  s.routing.method = RoutingMethod::kSparseMixer;
  check_shards_sum(s, {0, 5, 8}, 16);
  s.routing.method = RoutingMethod::kTopKSigmoid;
  s.routing.top_k = 1;
  s.routing.normalize = false;
  s.routing.combine = CombineMode::kScaleInput;  // Llama-4: the weight scales the input
  // One route per token: with 16 tokens every route lands in the middle shard of six experts
  // once in a hundred seeds ((6/8)^16), which fails the check that two shards have routes; at 64
  // tokens that takes (6/8)^64 = 1e-8.
  check_shards_sum(s, {0, 1, 7, 8}, 64);

  LayerSpec g = small_spec(WeightFormat::kFp8Block, 256, 128, 16, 4);
  g.routing.method = RoutingMethod::kGroupedTopK;
  g.routing.n_group = 4;
  g.routing.topk_group = 2;
  g.routing.routed_scaling_factor = 2.5f;
  check_shards_sum(g, {0, 4, 8, 12, 16}, 16);
  g.routing.method = RoutingMethod::kSoftmaxTopK;
  check_shards_sum(g, {0, 4, 8, 12, 16}, 16, /*router_weights=*/true);
}

TEST(LocalExperts, SharedExpertsBelongToTheShardHoldingTheirIndex) {
  LayerSpec s = small_spec(WeightFormat::kInt8);
  s.routing.num_shared = 2;               // experts 6 and 7
  check_shards_sum(s, {0, 4, 7, 8}, 16);  // one shared expert in each of the last two shards
  s.activation.glu = GluLayout::kSeparateFc3;
  s.has_fc3_bias = true;
  check_shards_sum(s, {0, 6, 8}, 16);
}

TEST(LocalExperts, FixedShardingIsBitwiseReproducibleAcrossThreadCounts) {
  const uint64_t seed = fresh_seed();
  LayerSpec spec = small_spec(WeightFormat::kMxFp4);
  spec.routing.num_shared = 1;
  TestLayer whole;
  make_layer(spec, seed, &whole);
  TestInputs ti;
  make_inputs(spec, 33, seed, false, &ti);
  const std::vector<int64_t> bounds = {0, 3, 8};
  std::vector<float> sum1(33 * spec.hidden, 0.0f), sum3(33 * spec.hidden, 0.0f);
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    const TestLayer sh = make_shard(whole, bounds[r], bounds[r + 1] - bounds[r]);
    std::vector<float> a, b;
    run_cpu(sh.spec, sh.weights, ti.in, 1, &a);
    run_cpu(sh.spec, sh.weights, ti.in, 3, &b);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "shard " << r;
    for (size_t i = 0; i < a.size(); ++i) sum1[i] += a[i], sum3[i] += b[i];
  }
  EXPECT_EQ(std::memcmp(sum1.data(), sum3.data(), sum1.size() * 4), 0);
}

TEST(LocalExperts, ZeroTokensAndUntouchedShards) {
  const uint64_t seed = fresh_seed();
  const LayerSpec spec = small_spec(WeightFormat::kInt4);
  TestLayer whole;
  make_layer(spec, seed, &whole);
  const TestLayer sh = make_shard(whole, 6, 2);
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCpu, sh.spec, sh.weights, {}, &layer).is_ok());
  // Zero tokens, null pointers.
  RunInputs in;
  in.input = TensorView(nullptr, DType::kF32, {0, spec.hidden});
  in.router_logits = TensorView(nullptr, DType::kF32, {0, spec.num_experts});
  EXPECT_EQ(layer->workspace_size(0), 0u);
  Status st = layer->run(in, MutableTensorView(nullptr, DType::kF32, {0, spec.hidden}), nullptr, 0,
                         nullptr);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  std::vector<double> ref;
  EXPECT_TRUE(reference_forward(sh.spec, sh.weights, in, &ref).is_ok());
  EXPECT_TRUE(ref.empty());

  // Tokens routed only to experts 0 and 1 (logits far above the rest): this shard writes zeros.
  std::vector<float> x(4 * spec.hidden, 0.5f), logits(4 * spec.num_experts, -8.0f);
  for (int t = 0; t < 4; ++t) logits[t * spec.num_experts] = logits[t * spec.num_experts + 1] = 8;
  in.input = TensorView(x.data(), DType::kF32, {4, spec.hidden});
  in.router_logits = TensorView(logits.data(), DType::kF32, {4, spec.num_experts});
  std::vector<float> out(x.size(), 1.0f);
  st = run_layer(*layer, in, MutableTensorView(out.data(), DType::kF32, {4, spec.hidden}));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (float v : out) ASSERT_EQ(v, 0.0f);
}

TEST(LocalExperts, BadRangesAreRefusedNamingTheField) {
  TestLayer whole;
  make_layer(small_spec(WeightFormat::kInt4), 7, &whole);
  auto expect = [](const LayerSpec& s, const LayerWeights& w, const std::string& needle) {
    const Status st = check_layer(s, w);
    EXPECT_FALSE(st.is_ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    std::unique_ptr<PreparedLayer> layer;
    EXPECT_FALSE(prepare_layer(BackendKind::kCpu, s, w, {}, &layer).is_ok()) << needle;
    EXPECT_FALSE(prepare_layer(BackendKind::kCuda, s, w, {}, &layer).is_ok()) << needle;
  };
  TestLayer sh = make_shard(whole, 2, 4);
  ASSERT_TRUE(check_layer(sh.spec, sh.weights).is_ok());
  LayerSpec s = sh.spec;
  s.local_experts = 9;
  expect(s, sh.weights, "local_experts: expected 0 (all) to num_experts = 8, got 9");
  s.local_experts = -1;
  expect(s, sh.weights, "local_experts");
  s = sh.spec;
  s.first_expert = 5;  // 5 + 4 > 8
  expect(s, sh.weights, "first_expert: expected 0 <= first_expert <= num_experts - local_experts");
  s.first_expert = -1;
  expect(s, sh.weights, "first_expert");
  s = whole.spec;
  s.first_expert = 1;  // all experts held: the range must start at 0
  expect(s, whole.weights, "first_expert");
  s = sh.spec;
  s.local_experts = 3;  // the weights hold 4 experts
  expect(s, sh.weights, "fc1_experts_weights");
  s = whole.spec;
  s.local_experts = 4;  // the whole layer's weights where 4 experts are expected
  expect(s, whole.weights, "fc1_experts_weights");
}

class LocalExpertsFile : public TempDirTest {};

TEST_F(LocalExpertsFile, LayerFileCarriesTheRange) {
  LayerSpec spec = small_spec(WeightFormat::kNvFp4);
  spec.routing.method = RoutingMethod::kGroupedTopK;
  spec.routing.n_group = 2;
  TestLayer whole;
  make_layer(spec, fresh_seed(), &whole);
  const TestLayer sh = make_shard(whole, 3, 4);
  const std::string p = path("shard.safetensors");
  Status st = save_layer_file(p, sh.spec, sh.weights);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  LoadedLayer l;
  st = load_layer_file(p, &l);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(l.spec.num_experts, 8);
  EXPECT_EQ(l.spec.first_expert, 3);
  EXPECT_EQ(l.spec.local_experts, 4);
  EXPECT_EQ(l.spec.routing.method, RoutingMethod::kGroupedTopK);
  EXPECT_EQ(l.file->metadata().at("qmoe.num_experts"), "8");
  EXPECT_EQ(l.file->metadata().at("qmoe.first_expert"), "3");

  // An unsharded layer writes neither key.
  const std::string q = path("whole.safetensors");
  ASSERT_TRUE(save_layer_file(q, whole.spec, whole.weights).is_ok());
  LoadedLayer lw;
  ASSERT_TRUE(load_layer_file(q, &lw).is_ok());
  EXPECT_EQ(lw.file->metadata().count("qmoe.num_experts"), 0u);
  EXPECT_FALSE(lw.spec.sharded());
}

TEST(LocalExperts, OrtImportTakesEFromTheRouter) {
  TestLayer whole;
  make_layer(small_spec(WeightFormat::kInt4), fresh_seed(), &whole);
  TestInputs ti;
  make_inputs(whole.spec, 3, 5, false, &ti);
  const TestLayer sh = make_shard(whole, 4, 2);
  TensorView in[kNumOrtInputs];
  in[kOrtInput] = ti.in.input;
  in[kOrtRouterProbs] = ti.in.router_logits;   // [3, 8]
  in[kOrtFc1Weights] = sh.weights.fc1.weight;  // [2, ...]
  in[kOrtFc1Scales] = sh.weights.fc1.scales;
  in[kOrtFc2Weights] = sh.weights.fc2.weight;
  in[kOrtFc2Scales] = sh.weights.fc2.scales;
  OrtQMoEAttributes a;
  a.k = 2;
  a.activation_type = "swiglu";
  a.swiglu_fusion = 1;
  a.normalize_routing_weights = 1;
  a.block_size = whole.spec.fc1.block_size;
  OrtImportOptions opt;
  opt.first_expert = 4;
  LayerSpec s;
  LayerWeights w;
  Status st = layer_from_ort(a, in, opt, &s, &w);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(s.num_experts, 8);
  EXPECT_EQ(s.local_experts, 2);
  EXPECT_EQ(s.first_expert, 4);
  opt.first_expert = 7;  // 7 + 2 > 8
  st = layer_from_ort(a, in, opt, &s, &w);
  EXPECT_NE(st.message().find("first_expert"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace qmoe::test

// The CPU backend against the fp64 oracle: every format, activation, routing method and dtype, on
// fresh random layers; plus the workspace contract (exact size, poison, canaries) and determinism.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>

#include "activation_cases.h"
#include "layer_factory.h"
#include "qmoe/routing.h"

namespace qmoe::test {
namespace {

// fp32 arithmetic vs fp64 lands near 1e-6; f16/bf16 outputs add their own rounding.
double budget(DType t) {
  switch (t) {
    case DType::kF16:
      return 1e-3;
    case DType::kBF16:
      return 6e-3;
    default:
      return 1e-5;
  }
}

struct RunResult {
  std::vector<uint8_t> out;
  std::vector<double> out_f64;
  double error = 0;
};

// Runs the CPU backend with an exactly sized, poisoned workspace followed by a canary, checks
// the canary and that every output element was written, and compares with the oracle.
void run_and_check(const TestLayer& tl, const TestInputs& ti, int threads, RunResult* res,
                   uint8_t poison = 0xFF) {
  const LayerSpec& s = tl.spec;
  std::unique_ptr<PreparedLayer> layer;
  PrepareOptions opt;
  opt.num_threads = threads;
  Status st = prepare_layer(BackendKind::kCpu, s, tl.weights, opt, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const int64_t t = ti.in.input.dims[0] * (ti.in.input.rank == 3 ? ti.in.input.dims[1] : 1);
  const size_t ws_bytes = layer->workspace_size(t);
  constexpr size_t kCanary = 256;
  std::vector<uint8_t> ws_buf(ws_bytes + kCanary + 64);
  uint8_t* ws = ws_buf.data() + (64 - reinterpret_cast<uintptr_t>(ws_buf.data()) % 64) % 64;
  std::memset(ws, poison, ws_bytes);
  std::memset(ws + ws_bytes, 0xA5, kCanary);

  const size_t esz = dtype_size(ti.in.input.dtype);
  res->out.assign(static_cast<size_t>(t * s.hidden) * esz, 0xFF);  // NaN in every float type
  MutableTensorView out(res->out.data(), ti.in.input.dtype, {t, s.hidden});
  st = layer->run(ti.in, out, ws, ws_bytes, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  for (size_t i = 0; i < kCanary; ++i) ASSERT_EQ(ws[ws_bytes + i], 0xA5) << "canary byte " << i;

  std::vector<double> ref;
  st = reference_forward(s, tl.weights, ti.in, &ref);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  res->out_f64.resize(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    res->out_f64[i] = load_float(res->out.data(), ti.in.input.dtype, static_cast<int64_t>(i));
    ASSERT_FALSE(std::isnan(res->out_f64[i])) << "output " << i << " not written or NaN";
  }
  res->error = relative_norm_error(res->out_f64.data(), ref.data(), ref.size());
}

void check_layer_case(const LayerSpec& spec, int64_t tokens, bool router_weights = false) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(spec, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed, router_weights, &ti);
  RunResult r;
  run_and_check(tl, ti, 2, &r);
  EXPECT_LE(r.error, budget(spec.act_dtype))
      << "format " << spec.fc1.to_string() << " dtype " << dtype_name(spec.act_dtype);
}

class EveryFormat : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(EveryFormat, MatchesOracle) {
  const WeightFormat f = static_cast<WeightFormat>(std::get<0>(GetParam()));
  LayerSpec s = small_spec(f);
  s.act_dtype = std::get<1>(GetParam());
  check_layer_case(s, 7);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, EveryFormat,
    ::testing::Combine(::testing::Range(0, kNumWeightFormats),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
    [](const auto& info) {
      return std::string(format_info(static_cast<WeightFormat>(std::get<0>(info.param))).name) +
             "_" + dtype_name(std::get<1>(info.param));
    });

TEST(CpuBackend, IntegerVariants) {
  for (WeightFormat f :
       {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kInt4, WeightFormat::kInt8}) {
    for (int block : {0, 16, 32, 128}) {
      for (bool zp : {false, true}) {
        for (DType sd : {DType::kF32, DType::kF16, DType::kBF16}) {
          LayerSpec s = small_spec(f, 256, 128, 4, 2);
          s.fc1.block_size = s.fc2.block_size = block;
          s.fc1.zero_points = s.fc2.zero_points = zp;
          s.fc1.scale_dtype = s.fc2.scale_dtype = sd;
          SCOPED_TRACE(s.fc1.to_string());
          check_layer_case(s, 3);
        }
      }
    }
  }
}

TEST(CpuBackend, MixedWidthsPerFc) {
  const WeightFormat pairs[][2] = {
      {WeightFormat::kInt4, WeightFormat::kInt2},  {WeightFormat::kInt2, WeightFormat::kInt4},
      {WeightFormat::kInt2, WeightFormat::kInt2},  {WeightFormat::kInt8, WeightFormat::kInt3},
      {WeightFormat::kNvFp4, WeightFormat::kInt4}, {WeightFormat::kFp8Block, WeightFormat::kMxFp4}};
  for (const auto& p : pairs) {
    LayerSpec s = small_spec(p[0]);
    s.fc2 = default_fc_format(p[1]);
    SCOPED_TRACE(s.fc1.to_string() + " / " + s.fc2.to_string());
    check_layer_case(s, 5);
  }
}

TEST(CpuBackend, Fp4OrtNPackedLayout) {
  for (WeightFormat f : {WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    LayerSpec s = small_spec(f);
    s.fc1.fp4_layout = s.fc2.fp4_layout = Fp4Layout::kNPacked;
    check_layer_case(s, 4);
  }
}

TEST(CpuBackend, Activations) {
  for (const ActivationSpec& a : activation_cases()) {
    for (bool bias : {false, true}) {
      LayerSpec s = small_spec(WeightFormat::kInt4);
      s.activation = a;
      s.has_fc1_bias = s.has_fc2_bias = bias;
      s.has_fc3_bias = bias && s.has_fc3();
      SCOPED_TRACE(activation_case_name(a) + (bias ? " bias" : ""));
      check_layer_case(s, 6);
    }
  }
}

TEST(CpuBackend, RoutingMethods) {
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
    s.routing.normalize = false;
    check_layer_case(s, 9);
    check_layer_case(s, 9, /*router_weights=*/true);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
    s.routing.method = RoutingMethod::kTopKSoftmax;
    s.routing.ties = TieBreak::kHigherIndex;
    check_layer_case(s, 9);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 16, 2);
    s.routing.method = RoutingMethod::kSparseMixer;
    check_layer_case(s, 9);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 32, 8);
    s.routing.method = RoutingMethod::kGroupedTopK;
    s.routing.n_group = 8;
    s.routing.topk_group = 4;
    s.routing.routed_scaling_factor = 2.5f;
    check_layer_case(s, 9);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 9, 1);  // Llama-4: input scaling
    s.routing.method = RoutingMethod::kTopKSigmoid;
    s.routing.combine = CombineMode::kScaleInput;
    s.routing.num_shared = 1;
    s.routing.shared_weight = SharedWeight::kOne;
    check_layer_case(s, 9);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 12, 3);  // shared experts
    s.routing.num_shared = 2;
    check_layer_case(s, 5);
  }
}

TEST(CpuBackend, ShapesAndTokenCounts) {
  for (int64_t tokens : {1, 2, 7, 8, 9, 33}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 192, 96, 8, 2);  // H, I not powers of two
    s.fc1.block_size = s.fc2.block_size = 32;
    check_layer_case(s, tokens);
  }
  for (int k : {1, 3, 8}) {
    LayerSpec s = small_spec(WeightFormat::kInt8, 128, 64, 8, k);
    s.fc1.block_size = s.fc2.block_size = 64;
    check_layer_case(s, 4);
  }
  check_layer_case(small_spec(WeightFormat::kFp8Block, 200, 72, 4, 2), 3);  // partial 128-blocks
}

// A shared expert of weight 1 adds exactly what a sigmoid-weighted one adds when its logit is so
// large that the sigmoid rounds to 1 (30: exp(-30) is far below half an ulp of 1), whatever the
// weight-1 layer's own shared logits are.
TEST(CpuBackend, SharedWeightOneEqualsSaturatedSigmoid) {
  const uint64_t seed = fresh_seed();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 10, 3);
    s.act_dtype = dt;
    s.routing.num_shared = 2;
    TestLayer sigmoid_layer, one_layer;
    make_layer(s, seed, &sigmoid_layer);
    s.routing.shared_weight = SharedWeight::kOne;
    make_layer(s, seed, &one_layer);  // the same weights
    TestInputs ti;
    make_inputs(s, 7, seed, false, &ti);
    RunResult one, sigmoid;
    run_and_check(one_layer, ti, 2, &one);
    EXPECT_LE(one.error, budget(dt));
    for (int64_t t = 0; t < 7; ++t) {
      for (int64_t e = 8; e < 10; ++e) store_float(ti.logits.data(), dt, t * 10 + e, 30.0f);
    }
    run_and_check(sigmoid_layer, ti, 2, &sigmoid);
    EXPECT_EQ(one.out, sigmoid.out) << dtype_name(dt);
  }
}

TEST(CpuBackend, ThreeDimensionalInput) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kInt4), seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, 6, seed, false, &ti);
  RunResult flat, batched;
  run_and_check(tl, ti, 2, &flat);
  ti.in.input = TensorView(ti.x.data(), tl.spec.act_dtype, {2, 3, tl.spec.hidden});
  run_and_check(tl, ti, 2, &batched);
  EXPECT_EQ(flat.out, batched.out);
}

// Output bits do not depend on the thread count or on what the workspace held before.
TEST(CpuBackend, DeterministicAcrossThreadsAndPoison) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  make_layer(s, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, 13, seed, false, &ti);
  RunResult a, b, c;
  run_and_check(tl, ti, 1, &a, 0xFF);
  run_and_check(tl, ti, 2, &b, 0x00);
  run_and_check(tl, ti, 3, &c, 0x7F);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
}

// workspace_size() follows the documented formula exactly.
TEST(CpuBackend, WorkspaceSizeFormula) {
  auto a = [](size_t n) { return (n + 63) / 64 * 64; };
  for (bool fc3 : {false, true}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
    if (fc3) s.activation.glu = GluLayout::kSeparateFc3;
    TestLayer tl;
    make_layer(s, fresh_seed(), &tl);
    for (int threads : {1, 3}) {
      std::unique_ptr<PreparedLayer> layer;
      PrepareOptions opt;
      opt.num_threads = threads;
      ASSERT_TRUE(prepare_layer(BackendKind::kCpu, s, tl.weights, opt, &layer).is_ok());
      for (int64_t t : {1, 5, 64}) {
        const int64_t r = t * s.slots();
        size_t want = a(route_maps_bytes(t, s.slots(), s.num_experts)) + a(4 * s.num_experts) +
                      a(4 * t * s.hidden) + a(4 * r * s.fc1_rows()) + a(4 * r * s.inter) +
                      a(4 * r * s.hidden) + threads * a(4 * std::max(s.hidden, s.inter));
        if (fc3) want += a(4 * r * s.inter);
        EXPECT_EQ(layer->workspace_size(t), want) << "tokens " << t << " threads " << threads;
      }
    }
  }
}

TEST(CpuBackend, RejectsBadCalls) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kInt4), seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, 4, seed, false, &ti);
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, {}, &layer).is_ok());
  std::vector<float> out(4 * tl.spec.hidden, std::nanf(""));
  MutableTensorView ov(out.data(), DType::kF32, {4, tl.spec.hidden});
  const size_t bytes = layer->workspace_size(4);
  std::vector<uint8_t> buf(bytes + 128);
  uint8_t* ws = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64;

  Status st = layer->run(ti.in, ov, ws, bytes - 1, nullptr);
  EXPECT_NE(st.message().find("workspace: expected at least " + std::to_string(bytes)),
            std::string::npos)
      << st.message();
  EXPECT_TRUE(std::isnan(out[0])) << "nothing may be written on error";
  st = layer->run(ti.in, ov, ws + 1, bytes, nullptr);
  EXPECT_NE(st.message().find("64-byte aligned"), std::string::npos) << st.message();

  std::vector<float> x(reinterpret_cast<float*>(ti.x.data()),
                       reinterpret_cast<float*>(ti.x.data()) + 4 * tl.spec.hidden);
  x[2 * tl.spec.hidden + 5] = std::numeric_limits<float>::infinity();
  RunInputs bad = ti.in;
  bad.input = TensorView(x.data(), DType::kF32, {4, tl.spec.hidden});
  st = layer->run(bad, ov, ws, bytes, nullptr);
  EXPECT_NE(st.message().find("input: non-finite value inf at token 2, column 5"),
            std::string::npos)
      << st.message();

  bad = ti.in;  // zero tokens are a valid call (test_zero_tokens.cpp), but not with this output
  bad.input = TensorView(ti.x.data(), DType::kF32, {0, tl.spec.hidden});
  st = layer->run(bad, ov, ws, bytes, nullptr);
  EXPECT_NE(st.message().find("router_probs: expected f32 [0, 8]"), std::string::npos)
      << st.message();

  bad = ti.in;
  bad.input = TensorView(ti.x.data(), DType::kF32, {4, tl.spec.hidden - 1});
  st = layer->run(bad, ov, ws, bytes, nullptr);
  EXPECT_NE(st.message().find("input: expected shape [tokens, 256]"), std::string::npos)
      << st.message();

  bad = ti.in;
  bad.router_logits = TensorView(ti.logits.data(), DType::kF32, {4, tl.spec.num_experts - 1});
  st = layer->run(bad, ov, ws, bytes, nullptr);
  EXPECT_NE(st.message().find("router_probs: expected f32 [4, 8]"), std::string::npos)
      << st.message();

  MutableTensorView wrong(out.data(), DType::kF16, {4, tl.spec.hidden});
  st = layer->run(ti.in, wrong, ws, bytes, nullptr);
  EXPECT_NE(st.message().find("output: expected dtype f32"), std::string::npos) << st.message();
}

TEST(CpuBackend, CudaBackendReportsItselfUnavailable) {
  if (backend_available(BackendKind::kCuda)) {
    GTEST_SKIP() << "a CUDA device is present: the GPU suite (ctest -L gpu) covers the backend";
  }
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kInt4), fresh_seed(), &tl);
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("backend cuda"), std::string::npos);
  EXPECT_FALSE(backend_available(BackendKind::kCuda));
}

}  // namespace
}  // namespace qmoe::test

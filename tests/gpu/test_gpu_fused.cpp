// The fused decode kernel (src/cuda/fused/): one cooperative launch for routing, FC1, FC2 and the
// combine. Against the fp64 oracle over widths, zero points, blocks, dtypes, activations, biases,
// routing options and shapes; bit for bit against itself on other grid sizes and in graph
// replays; the dispatch offering it; non-finite inputs reported.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "activation_cases.h"
#include "cuda/fused/fused_decode.h"
#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

// Runs ti on tl through the fused kernel (checked to be the layer's choice for the call), on at
// most grid_ctas CTAs (0: as many as the device holds).
void fused_run(const TestLayer& tl, const TestInputs& ti, GpuRun* r, int grid_ctas = 0) {
  PrepareOptions o = with_dispatch("fused");
  o.fused_grid_ctas = grid_ctas;
  std::unique_ptr<PreparedLayer> layer;
  const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, o, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(layer->dispatch_choice(tokens_of(ti.in)), "fused");
  gpu_run(tl, ti, r, {}, 0xFF, true, layer.get());
}

void check_fused(const LayerSpec& s, int64_t tokens, bool router_weights = false) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed, router_weights, &ti);
  GpuRun r;
  fused_run(tl, ti, &r);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_LE(r.error, gpu_budget(s.act_dtype))
      << layer_name(s) << ", " << tokens << " tokens, seed " << seed;
}

// A fresh small int4 bf16 layer (H 256, I 128, E 16, k 4) from `seed`, prepared with `options`.
void prepare_small(uint64_t seed, const PrepareOptions& options, TestLayer* tl,
                   std::unique_ptr<PreparedLayer>* layer) {
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.act_dtype = DType::kBF16;
  make_layer(s, seed, tl);
  const Status st = prepare_layer(BackendKind::kCuda, tl->spec, tl->weights, options, layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
}

TEST(GpuFused, IntegerFormatsMatchOracle) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kInt2, WeightFormat::kInt4, WeightFormat::kInt8}) {
    for (int block : {0, 16, 32, 128}) {
      for (bool zp : {false, true}) {
        for (DType dt : {DType::kBF16, DType::kF16}) {
          LayerSpec s = small_spec(f, 256, 128, 16, 4);
          s.act_dtype = dt;
          s.fc1.block_size = s.fc2.block_size = block;
          s.fc1.zero_points = s.fc2.zero_points = zp;
          s.fc1.scale_dtype = block == 32 ? DType::kBF16 : DType::kF32;
          SCOPED_TRACE(s.fc1.to_string() + " " + dtype_name(dt));
          const int chunk_k = 16 * (16 / (f == WeightFormat::kInt2   ? 2
                                          : f == WeightFormat::kInt4 ? 4
                                                                     : 8));
          if (zp && block >= chunk_k) continue;  // ZeroPointsTakeTheDecodeKernel
          for (int64_t tokens : {1, 5, 16}) check_fused(s, tokens);
        }
      }
    }
  }
}

// Zero points with scale blocks of whole chunks (int8 b32, int4 b128, int2 b128): the fused kernel
// is not offered (its FC1 results were off the oracle there); the decode kernel takes them.
TEST(GpuFused, ZeroPointsTakeTheDecodeKernel) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kInt2, WeightFormat::kInt4, WeightFormat::kInt8}) {
    LayerSpec s = small_spec(f, 256, 128, 16, 4);
    s.act_dtype = DType::kBF16;
    s.fc1.block_size = s.fc2.block_size = f == WeightFormat::kInt8 ? 32 : 128;
    s.fc1.zero_points = true;
    SCOPED_TRACE(layer_name(s));
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    std::unique_ptr<PreparedLayer> layer;
    ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer).is_ok());
    for (const std::string& c : layer->dispatch_candidates(1)) EXPECT_NE(c, "fused");
    TestInputs ti;
    make_inputs(tl.spec, 1, seed, false, &ti);
    GpuRun d;
    gpu_run(tl, ti, &d, {}, 0xFF, true, layer.get());
    EXPECT_LE(d.error, gpu_budget(s.act_dtype)) << "seed " << seed;
  }
}

TEST(GpuFused, ActivationsAndBiases) {
  QMOE_REQUIRE_GPU();
  for (const ActivationSpec& a : activation_cases()) {
    if (a.glu == GluLayout::kSeparateFc3 && a.gated()) continue;  // not a decode layout
    LayerSpec s = small_spec(WeightFormat::kInt4);
    s.act_dtype = DType::kBF16;
    s.activation = a;
    s.has_fc1_bias = s.has_fc2_bias = true;
    SCOPED_TRACE(activation_case_name(a));
    check_fused(s, 7);
  }
}

TEST(GpuFused, RoutingOptions) {
  QMOE_REQUIRE_GPU();
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 9, 1);  // Llama-4 input scaling
    s.act_dtype = DType::kBF16;
    s.routing.method = RoutingMethod::kTopKSigmoid;
    s.routing.combine = CombineMode::kScaleInput;
    s.routing.num_shared = 1;
    s.routing.shared_weight = SharedWeight::kOne;  // Llama-4 adds its shared expert with weight 1
    check_fused(s, 8);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 12, 3);  // shared experts, weights
    s.act_dtype = DType::kF16;
    s.routing.num_shared = 2;
    check_fused(s, 6, /*router_weights=*/true);
  }
  for (RoutingMethod m : {RoutingMethod::kSoftmaxTopK, RoutingMethod::kTopKSoftmax,
                          RoutingMethod::kSparseMixer, RoutingMethod::kGroupedTopK}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 2);
    s.act_dtype = DType::kBF16;
    s.routing.method = m;
    if (m == RoutingMethod::kGroupedTopK) {
      s.routing.n_group = 4;
      s.routing.topk_group = 2;
      s.routing.routed_scaling_factor = 2.5f;
    }
    SCOPED_TRACE(routing_method_name(m));
    check_fused(s, 3);
  }
}

// Every token on every expert (16 routes per expert: both column groups), many experts, K and I
// not multiples of a slice, the widest slices.
TEST(GpuFused, ShapesAndEdges) {
  QMOE_REQUIRE_GPU();
  for (int64_t tokens : {1, 8, 9, 16}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 8, 8);
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE("all experts, tokens " + std::to_string(tokens));
    check_fused(s, tokens);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 128, 64, 512, 16);
    s.fc1.block_size = s.fc2.block_size = 32;
    s.act_dtype = DType::kBF16;
    check_fused(s, 8);
  }
  struct Shape {
    WeightFormat f;
    int64_t h, i;
  };
  for (const Shape& sh :
       {Shape{WeightFormat::kInt4, 208, 80}, Shape{WeightFormat::kInt2, 80, 48},
        Shape{WeightFormat::kInt8, 176, 112}, Shape{WeightFormat::kInt4, 2048, 768}}) {
    LayerSpec s = small_spec(sh.f, sh.h, sh.i, 32, 4);
    s.fc1.block_size = s.fc2.block_size = sh.h == 2048 ? 128 : 16;
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE(layer_name(s));
    check_fused(s, 1);
    check_fused(s, 16);
  }
}

// The bits depend on the layer and the inputs only: one CTA, a few, and the whole device agree.
TEST(GpuFused, GridSizeKeepsTheBits) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  LayerSpec s = small_spec(WeightFormat::kInt4, 512, 256, 32, 4);
  s.fc1.block_size = s.fc2.block_size = 32;  // zero points with blocks shorter than a chunk
  s.fc1.zero_points = s.fc2.zero_points = true;
  s.act_dtype = DType::kBF16;
  TestLayer tl;
  make_layer(s, seed, &tl);
  for (int64_t tokens : {1, 6, 16}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    GpuRun all, one, few;
    fused_run(tl, ti, &all);
    fused_run(tl, ti, &one, 1);
    fused_run(tl, ti, &few, 5);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_LE(all.error, gpu_budget(s.act_dtype));
    EXPECT_EQ(one.out, all.out) << tokens << " tokens, seed " << seed;
    EXPECT_EQ(few.out, all.out) << tokens << " tokens, seed " << seed;
  }
}

TEST(GpuFused, GraphReplayKeepsTheBits) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  std::unique_ptr<PreparedLayer> layer;
  prepare_small(seed, with_dispatch("fused"), &tl, &layer);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int64_t tokens : {1, 11}) check_graph_replay(tl, layer.get(), tokens, seed, 3);
}

// The dispatch offers the fused kernel up to its bound on the layers it takes, and only there.
TEST(GpuFused, DispatchOffersItWhereItRuns) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  std::unique_ptr<PreparedLayer> layer;
  prepare_small(seed, {}, &tl, &layer);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto offers = [&](int64_t t) {
    for (const std::string& c : layer->dispatch_candidates(t)) {
      if (c == "fused") return true;
    }
    return false;
  };
  EXPECT_TRUE(offers(1));
  EXPECT_TRUE(offers(cuda::kFusedDecodeMaxTokens));
  EXPECT_FALSE(offers(cuda::kFusedDecodeMaxTokens + 1));
  ASSERT_TRUE(layer->force_dispatch("fused").is_ok());  // past the bound: the decode kernel
  EXPECT_EQ(layer->dispatch_choice(cuda::kFusedDecodeMaxTokens + 1), "decode/1");
  LayerSpec fp4 = small_spec(WeightFormat::kNvFp4, 256, 128, 16, 4);
  fp4.act_dtype = DType::kBF16;
  TestLayer tl4;
  make_layer(fp4, seed, &tl4);
  std::unique_ptr<PreparedLayer> l4;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl4.spec, tl4.weights, {}, &l4).is_ok());
  for (const std::string& c : l4->dispatch_candidates(4)) EXPECT_NE(c, "fused");
  EXPECT_FALSE(l4->force_dispatch("fused").is_ok()) << "not a path of this layer";
}

TEST(GpuFused, NonFiniteInputIsReported) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  std::unique_ptr<PreparedLayer> layer;
  prepare_small(seed, with_dispatch("fused"), &tl, &layer);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const LayerSpec& s = tl.spec;
  TestInputs ti;
  make_inputs(tl.spec, 6, seed, false, &ti);
  store_float(ti.x.data(), DType::kBF16, 4 * s.hidden + 9, std::numeric_limits<float>::infinity());
  store_float(ti.logits.data(), ti.in.router_logits.dtype, 2 * s.num_experts + 3,
              std::numeric_limits<float>::quiet_NaN());
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(ti, &d));
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(layer->workspace_size(6)));
  ASSERT_TRUE(out.allocate(6 * s.hidden * 2));
  MutableTensorView ov(out.get(), DType::kBF16, {6, s.hidden});
  ASSERT_TRUE(layer->run(d.in, ov, ws.get(), ws.bytes(), nullptr).is_ok());
  const Status st = layer->take_deferred_error();
  EXPECT_NE(st.message().find("first at token 2"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("router_probs, input: non-finite"), std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace qmoe::test

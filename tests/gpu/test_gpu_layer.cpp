// The CUDA backend's whole layer against the fp64 oracle: every format x activation dtype, every
// activation, every routing method, token counts across the decode/prefill boundaries, odd shapes,
// experts 8..512 and k 1..16; plus waves, poison independence and mixed widths.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "activation_cases.h"
#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

class GpuEveryFormat : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(GpuEveryFormat, MatchesOracle) {
  QMOE_REQUIRE_GPU();
  const WeightFormat f = static_cast<WeightFormat>(std::get<0>(GetParam()));
  LayerSpec s = small_spec(f, 256, 128, 16, 4);
  s.act_dtype = std::get<1>(GetParam());
  for (int64_t tokens : {1, 9, 70}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    check_gpu_case(s, tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gpu, GpuEveryFormat,
    ::testing::Combine(::testing::Range(0, kNumWeightFormats),
                       ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
    [](const auto& info) {
      return std::string(format_info(static_cast<WeightFormat>(std::get<0>(info.param))).name) +
             "_" + dtype_name(std::get<1>(info.param));
    });

TEST(GpuLayer, IntegerVariants) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f :
       {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kInt4, WeightFormat::kInt8}) {
    for (int block : {0, 16, 64, 256}) {
      for (bool zp : {false, true}) {
        for (DType sd : {DType::kF32, DType::kF16, DType::kBF16}) {
          LayerSpec s = small_spec(f, 256, 256, 8, 2);
          s.act_dtype = DType::kF32;  // the exact path: any decode slip shows
          s.fc1.block_size = s.fc2.block_size = block;
          s.fc1.zero_points = s.fc2.zero_points = zp;
          s.fc1.scale_dtype = s.fc2.scale_dtype = sd;
          SCOPED_TRACE(s.fc1.to_string());
          check_gpu_case(s, 3);
        }
      }
    }
  }
}

TEST(GpuLayer, MixedWidthsPerFc) {
  QMOE_REQUIRE_GPU();
  const WeightFormat pairs[][2] = {{WeightFormat::kInt4, WeightFormat::kInt2},
                                   {WeightFormat::kInt2, WeightFormat::kInt4},
                                   {WeightFormat::kInt8, WeightFormat::kInt3},
                                   {WeightFormat::kNvFp4, WeightFormat::kInt4},
                                   {WeightFormat::kFp8Block, WeightFormat::kMxFp4}};
  for (const auto& p : pairs) {
    LayerSpec s = small_spec(p[0]);
    s.fc2 = default_fc_format(p[1]);
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE(s.fc1.to_string() + " / " + s.fc2.to_string());
    check_gpu_case(s, 5);
  }
}

TEST(GpuLayer, Fp4OrtNPackedLayout) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    LayerSpec s = small_spec(f);
    s.fc1.fp4_layout = s.fc2.fp4_layout = Fp4Layout::kNPacked;
    check_gpu_case(s, 4);
  }
}

TEST(GpuLayer, Activations) {
  QMOE_REQUIRE_GPU();
  for (const ActivationSpec& a : activation_cases()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const bool bias = dt == DType::kBF16;
      LayerSpec s = small_spec(WeightFormat::kInt4);
      s.act_dtype = dt;
      s.activation = a;
      s.has_fc1_bias = s.has_fc2_bias = bias;
      s.has_fc3_bias = bias && s.has_fc3();
      SCOPED_TRACE(activation_case_name(a) + " " + dtype_name(dt));
      check_gpu_case(s, 6);
    }
  }
}

TEST(GpuLayer, RoutingMethods) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dt));
    for (int64_t tokens : {3, 40}) {  // the fused and the general routing path
      {
        LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
        s.act_dtype = dt;
        s.routing.normalize = false;
        check_gpu_case(s, tokens);
        check_gpu_case(s, tokens, /*router_weights=*/true);
      }
      {
        LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
        s.act_dtype = dt;
        s.routing.method = RoutingMethod::kTopKSoftmax;
        s.routing.ties = TieBreak::kHigherIndex;
        check_gpu_case(s, tokens);
      }
      {
        LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 16, 2);
        s.act_dtype = dt;
        s.routing.method = RoutingMethod::kSparseMixer;
        check_gpu_case(s, tokens);
      }
      {
        LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 64, 8);
        s.act_dtype = dt;
        s.routing.method = RoutingMethod::kGroupedTopK;
        s.routing.n_group = 8;
        s.routing.topk_group = 4;
        s.routing.routed_scaling_factor = 2.5f;
        check_gpu_case(s, tokens);
      }
      {
        LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 9, 1);  // Llama-4
        s.act_dtype = dt;
        s.routing.method = RoutingMethod::kTopKSigmoid;
        s.routing.combine = CombineMode::kScaleInput;
        s.routing.num_shared = 1;
        s.routing.shared_weight = SharedWeight::kOne;
        check_gpu_case(s, tokens);
      }
      {
        LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 12, 3);  // shared experts
        s.act_dtype = dt;
        s.routing.num_shared = 2;
        check_gpu_case(s, tokens, /*router_weights=*/true);
      }
    }
  }
}

TEST(GpuLayer, TokenCounts) {
  QMOE_REQUIRE_GPU();
  for (int64_t tokens : {1, 2, 7, 8, 9, 64, 65, 1000, 4096}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE("tokens " + std::to_string(tokens));
    check_gpu_case(s, tokens);
  }
}

// H or I not a multiple of 128 (or of 32, where the format allows it).
TEST(GpuLayer, OddShapes) {
  QMOE_REQUIRE_GPU();
  struct Case {
    WeightFormat f;
    int block;
    int64_t h, i;
  };
  const Case cases[] = {
      {WeightFormat::kInt8, 0, 200, 72},        {WeightFormat::kInt4, 0, 197, 75},
      {WeightFormat::kInt3, 0, 203, 61},        {WeightFormat::kInt2, 16, 208, 80},
      {WeightFormat::kInt4, 32, 224, 96},       {WeightFormat::kFp8, 0, 201, 77},
      {WeightFormat::kFp8Block, 128, 200, 136}, {WeightFormat::kNvFp4, 16, 208, 80},
      {WeightFormat::kMxFp4, 32, 224, 96},
  };
  for (const Case& c : cases) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      LayerSpec s = small_spec(c.f, c.h, c.i, 8, 2);
      s.act_dtype = dt;
      s.fc1.block_size = s.fc2.block_size = c.block;
      SCOPED_TRACE(s.fc1.to_string() + " H " + std::to_string(c.h) + " I " + std::to_string(c.i) +
                   " " + dtype_name(dt));
      check_gpu_case(s, 9);
    }
  }
}

TEST(GpuLayer, ExpertsAndTopK) {
  QMOE_REQUIRE_GPU();
  struct Case {
    int64_t e;
    int k;
    int64_t tokens;
  };
  const Case cases[] = {{8, 1, 5},   {8, 8, 8},    {64, 6, 9},    {128, 8, 64},
                        {256, 8, 3}, {512, 10, 8}, {512, 16, 65}, {384, 12, 200}};
  for (const Case& c : cases) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 128, 64, c.e, c.k);
    s.fc1.block_size = s.fc2.block_size = 32;
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE("E " + std::to_string(c.e) + " k " + std::to_string(c.k) + " tokens " +
                 std::to_string(c.tokens));
    check_gpu_case(s, c.tokens);
  }
}

TEST(GpuLayer, ThreeDimensionalInput) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kInt4), seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, 6, seed, false, &ti);
  GpuRun flat, batched;
  gpu_run(tl, ti, &flat);
  ti.in.input = TensorView(ti.x.data(), tl.spec.act_dtype, {2, 3, tl.spec.hidden});
  gpu_run(tl, ti, &batched);
  EXPECT_EQ(flat.out, batched.out);
}

// The experts of a call run in waves when the dequantization scratch is capped; the arithmetic of
// each row is the same, so the output is bitwise that of one wave.
TEST(GpuLayer, WavesGiveTheSameBits) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 32, 4);
    s.act_dtype = dt;
    make_layer(s, seed, &tl);
    TestInputs ti;
    make_inputs(tl.spec, 50, seed, false, &ti);
    GpuRun one, many;
    gpu_run(tl, ti, &one);
    PrepareOptions opt;
    opt.max_dequant_bytes = 3 * 256 * 256 * dtype_size(dt);  // three experts' FC1 per wave
    gpu_run(tl, ti, &many, opt);
    EXPECT_LE(one.error, gpu_budget(dt));
    EXPECT_EQ(one.out, many.out) << dtype_name(dt);
  }
}

// What the workspace held before a call does not matter.
TEST(GpuLayer, OutputIndependentOfWorkspacePoison) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.act_dtype = DType::kBF16;
  make_layer(s, seed, &tl);
  for (int64_t tokens : {5, 100}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed, false, &ti);
    GpuRun a, b, c;
    gpu_run(tl, ti, &a, {}, 0xFF);
    gpu_run(tl, ti, &b, {}, 0x00, false);
    gpu_run(tl, ti, &c, {}, 0x7F, false);
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.out, c.out);
  }
}

}  // namespace
}  // namespace qmoe::test

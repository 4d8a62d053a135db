// The generic path on CUTLASS's mixed-input grouped GEMM (PrepareOptions::gemm = "cutlass", the
// default: INT4 codes converted in registers, no dequantize pass) against the fp64 oracle and the
// dequantize path ("cutlass-dequant") on the same inputs: within the dtype's budget and within
// twice the dequantize path's error, at b128, b64, b256 and per channel, f32 and activation-dtype
// scales, odd token counts and experts without routes, with a separate FC3, and FCs the kernel
// leaves to the dequantize path beside it. Graph replay bitwise equal to eager; the output
// independent of the workspace's poison; the prepared copy checked on the host.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

LayerSpec int4_spec(DType dt, int64_t h, int64_t i, int64_t e, int k, int block, DType scale) {
  LayerSpec s = small_spec(WeightFormat::kInt4, h, i, e, k);
  s.act_dtype = dt;
  for (FcFormat* f : {&s.fc1, &s.fc2, &s.fc3}) {
    f->block_size = block;
    f->scale_dtype = scale;
  }
  return s;
}

// Runs one layer and inputs through both GEMM choices; both within the budget, the mixed-input
// error at most twice the dequantize path's.
// On the generic path (dispatch "generic"), where the GEMM choice matters.
void check_mixed_against_dequant(const LayerSpec& s, int64_t tokens) {
  SCOPED_TRACE(std::string(dtype_name(s.act_dtype)) + " " + s.fc1.to_string() + " / " +
               s.fc2.to_string() + ", H " + std::to_string(s.hidden) + ", I " +
               std::to_string(s.inter) + ", E " + std::to_string(s.num_experts) + ", " +
               std::to_string(tokens) + " tokens");
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed, false, &ti);
  GpuRun mixed, dequant;
  const PrepareOptions generic = with_dispatch("generic");
  gpu_run(tl, ti, &mixed, with_gemm("cutlass", generic));
  if (::testing::Test::HasFatalFailure()) return;
  gpu_run(tl, ti, &dequant, with_gemm("cutlass-dequant", generic));
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_LE(mixed.error, gpu_budget(s.act_dtype));
  EXPECT_LE(dequant.error, gpu_budget(s.act_dtype));
  EXPECT_LE(mixed.error, 2 * dequant.error)
      << "mixed " << mixed.error << ", dequant " << dequant.error;
}

// 5 tokens over 16 experts leave experts without routes; 300 and 1100 give ragged groups of
// several N tiles (1100 x 4 routes over 16 experts: about 275 rows each); 333 is odd.
TEST(GpuMixedLayer, MatchesTheOracleAndTheDequantizePath) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int block : {128, 64}) {
      for (int64_t tokens : {5, 300, 333, 1100}) {
        check_mixed_against_dequant(int4_spec(dt, 256, 128, 16, 4, block, DType::kF32), tokens);
      }
    }
  }
}

// Per channel, b256, scales stored in the activation dtype (no rounding at prepare), many experts
// with few routes (64 experts, 7 tokens of top-2: at most 14 touched).
TEST(GpuMixedLayer, OtherBlocksAndScaleDtypes) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    check_mixed_against_dequant(int4_spec(dt, 256, 128, 16, 4, 0, DType::kF32), 301);
    check_mixed_against_dequant(int4_spec(dt, 512, 256, 16, 4, 256, DType::kF32), 257);
    check_mixed_against_dequant(int4_spec(dt, 256, 128, 16, 4, 128, dt), 129);
    check_mixed_against_dequant(int4_spec(dt, 256, 128, 64, 2, 128, DType::kF32), 7);
  }
}

// FC2 in blocks of 32 (below the K tile) runs through the dequantize pass while FC1 runs
// mixed-input in the same call; and a separate FC3, mixed-input like FC1.
TEST(GpuMixedLayer, MixedBesideDequantizeAndSeparateFc3) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    LayerSpec s = int4_spec(dt, 256, 128, 16, 4, 128, DType::kF32);
    s.fc2.block_size = 32;
    std::string why;
    EXPECT_TRUE(cuda::mixed_int4_supported(s.fc1, dt, s.fc1_rows(), s.hidden, &why)) << why;
    EXPECT_FALSE(cuda::mixed_int4_supported(s.fc2, dt, s.hidden, s.inter));
    check_mixed_against_dequant(s, 300);
    LayerSpec f3 = int4_spec(dt, 256, 128, 16, 4, 128, DType::kF32);
    f3.activation.glu = GluLayout::kSeparateFc3;
    check_mixed_against_dequant(f3, 300);
  }
}

// The mixed-input path holds no dequantization scratch: its workspace is smaller than the
// dequantize path's once a call touches many experts (which shows the kernel took every FC), and
// stays monotone in the token count.
TEST(GpuMixedLayer, WorkspaceHasNoScratchAndIsMonotone) {
  QMOE_REQUIRE_GPU();
  const LayerSpec s = int4_spec(DType::kBF16, 256, 128, 16, 4, 128, DType::kF32);
  TestLayer tl;
  make_layer(s, fresh_seed(), &tl);
  std::unique_ptr<PreparedLayer> mixed, dequant;
  ASSERT_TRUE(
      prepare_layer(BackendKind::kCuda, s, tl.weights, with_gemm("cutlass"), &mixed).is_ok());
  ASSERT_TRUE(
      prepare_layer(BackendKind::kCuda, s, tl.weights, with_gemm("cutlass-dequant"), &dequant)
          .is_ok());
  EXPECT_LT(mixed->workspace_size(300), dequant->workspace_size(300));
  size_t prev = 0;
  for (int64_t t = 1; t <= 3000; t += (t < 80 ? 1 : 131)) {
    const size_t w = mixed->workspace_size(t);
    EXPECT_GE(w, prev) << "tokens " << t;
    prev = w;
  }
  EXPECT_EQ(mixed->workspace_size(0), 0u);
  // A bad choice lists the three.
  std::unique_ptr<PreparedLayer> layer;
  const Status st = prepare_layer(BackendKind::kCuda, s, tl.weights, with_gemm("mixed"), &layer);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cutlass-dequant"), std::string::npos) << st.to_string();
}

TEST(GpuMixedLayer, GraphReplayEqualsEagerAndPoisonDoesNotMatter) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(int4_spec(dt, 256, 128, 16, 4, 64, DType::kF32), seed, &tl);
    std::unique_ptr<PreparedLayer> layer;
    ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights,
                              with_gemm("cutlass", with_dispatch("generic")), &layer)
                    .is_ok());
    check_graph_replay(tl, layer.get(), 333, seed, 2);
    TestInputs ti;
    make_inputs(tl.spec, 300, seed, false, &ti);
    GpuRun a, b, c;
    gpu_run(tl, ti, &a, {}, 0xFF, false, layer.get());
    gpu_run(tl, ti, &b, {}, 0x00, false, layer.get());
    gpu_run(tl, ti, &c, {}, 0x7F, false, layer.get());
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.out, c.out);
  }
}

// Which FCs the kernel takes (host-only, runs without a device).
TEST(MixedPrepare, SupportedFormats) {
  FcFormat f = default_fc_format(WeightFormat::kInt4);
  for (int block : {0, 64, 128, 256}) {
    f.block_size = block;
    EXPECT_TRUE(cuda::mixed_int4_supported(f, DType::kBF16, 256, 512)) << block;
    EXPECT_TRUE(cuda::mixed_int4_supported(f, DType::kF16, 256, 512)) << block;
    EXPECT_FALSE(cuda::mixed_int4_supported(f, DType::kF32, 256, 512)) << block;
  }
  f.block_size = 32;  // below the K tile
  EXPECT_FALSE(cuda::mixed_int4_supported(f, DType::kBF16, 256, 512));
  f.block_size = 128;
  EXPECT_FALSE(cuda::mixed_int4_supported(f, DType::kBF16, 256, 320));  // 128 does not divide
  EXPECT_FALSE(cuda::mixed_int4_supported(f, DType::kBF16, 252, 512));  // n % 8
  f.zero_points = true;
  EXPECT_FALSE(cuda::mixed_int4_supported(f, DType::kBF16, 256, 512));
  EXPECT_FALSE(
      cuda::mixed_int4_supported(default_fc_format(WeightFormat::kInt8), DType::kBF16, 256, 512));
}

// The prepared copy: every code byte is its source with both nibbles' top bit flipped (the int4
// q - 8); every scale lands exactly once, at [e, b, r] from [e, r, b], rounded to the activation
// dtype. Scales are distinct small integers (exact in f16 and bf16) so a misplaced one shows.
TEST(MixedPrepare, CodesAreSignedAndScalesAPermutation) {
  const int64_t E = 3, n = 16, k = 256;
  for (int block : {64, 128, 0}) {
    for (DType sdt : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (DType act : {DType::kBF16, DType::kF16}) {
        FcFormat f = default_fc_format(WeightFormat::kInt4);
        f.block_size = block;
        f.scale_dtype = sdt;
        const int64_t kb = block == 0 ? 1 : k / block;
        std::vector<uint8_t> codes(static_cast<size_t>(E * n * k / 2));
        for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 + 11);
        const size_t es = dtype_size(sdt);
        std::vector<uint8_t> scales(static_cast<size_t>(E * n * kb) * es);
        for (int64_t i = 0; i < E * n * kb; ++i) {
          const float v = static_cast<float>(i + 1);
          if (sdt == DType::kF32) {
            std::memcpy(&scales[i * es], &v, 4);
          } else {
            const uint16_t h = sdt == DType::kF16 ? num::f32_to_f16(v) : num::f32_to_bf16(v);
            std::memcpy(&scales[i * es], &h, 2);
          }
        }
        std::vector<uint8_t> codes_out;
        std::vector<uint16_t> scales_out;
        cuda::mixed_int4_prepare(f, act, E, n, k, codes.data(), scales.data(), &codes_out,
                                 &scales_out);
        ASSERT_EQ(codes_out.size(), codes.size());
        for (size_t i = 0; i < codes.size(); ++i) {
          for (int half = 0; half < 2; ++half) {
            const int q = (codes[i] >> (4 * half)) & 15;
            int s = (codes_out[i] >> (4 * half)) & 15;
            if (s >= 8) s -= 16;  // int4 two's complement
            ASSERT_EQ(s, q - 8) << "byte " << i << " nibble " << half;
          }
        }
        ASSERT_EQ(scales_out.size(), static_cast<size_t>(E * n * kb));
        std::map<int64_t, int> seen;
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t b = 0; b < kb; ++b) {
            for (int64_t r = 0; r < n; ++r) {
              const uint16_t h = scales_out[(e * kb + b) * n + r];
              const float v = act == DType::kBF16 ? num::bf16_to_f32(h) : num::f16_to_f32(h);
              ++seen[static_cast<int64_t>(v)];
              // E * n * kb <= 192 here: every value is exact in bf16 (8 significant bits).
              ASSERT_EQ(v, static_cast<float>((e * n + r) * kb + b + 1))
                  << "e " << e << " b " << b << " r " << r << " block " << block;
            }
          }
        }
        ASSERT_EQ(seen.size(), static_cast<size_t>(E * n * kb));
        for (const auto& [v, count] : seen) ASSERT_EQ(count, 1) << v;
      }
    }
  }
}

}  // namespace
}  // namespace qmoe::test

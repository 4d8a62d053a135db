// The generic path on CUTLASS's mixed-input grouped GEMM (PrepareOptions::gemm = "cutlass", the
// default: codes converted in registers, no dequantize pass) against the fp64 oracle and the
// dequantize path ("cutlass-dequant") on the same inputs: within the dtype's budget and within
// twice the dequantize path's error. Every kind of cutlass_mixed.h: symmetric INT4 at b128, b64,
// b256 and per channel, f32 and activation-dtype scales; INT4 and INT8 with zero points; INT8
// without; fp8 and fp8_block (with DeepSeek-V3's separate FC3). Odd token counts and experts
// without routes, FCs the kernel leaves to the dequantize path beside it. Graph replay bitwise
// equal to eager; the output independent of the workspace's poison; the prepared copy checked on
// the host against the library's own dequantizer.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "activation_cases.h"
#include "core/formats/mma_pack.h"
#include "core/numeric.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/dispatch.h"
#include "gpu_layer_harness.h"
#include "mixed_formats.h"
#include "qmoe/quantize.h"

namespace qmoe::test {
namespace {

LayerSpec spec_of(WeightFormat w, DType dt, int64_t h, int64_t i, int64_t e, int k, int block,
                  DType scale, bool zero_points = false) {
  LayerSpec s = small_spec(w, h, i, e, k);
  s.act_dtype = dt;
  for (FcFormat* f : {&s.fc1, &s.fc2, &s.fc3}) {
    f->block_size = block;
    f->scale_dtype = scale;
    f->zero_points = zero_points;
  }
  return s;
}

LayerSpec int4_spec(DType dt, int64_t h, int64_t i, int64_t e, int k, int block, DType scale) {
  return spec_of(WeightFormat::kInt4, dt, h, i, e, k, block, scale);
}

cuda::MixedCodes kind_of(const LayerSpec& s, const FcFormat& f, int64_t n, int64_t k) {
  return cuda::mixed_codes_for(f, s.act_dtype, n, k);
}

// Runs one layer and inputs through both GEMM choices; both within the budget, the mixed-input
// error at most twice the dequantize path's.
// On the generic path (dispatch "generic"), where the GEMM choice matters.
void check_mixed_against_dequant(const LayerSpec& s, int64_t tokens, int tile = 0) {
  SCOPED_TRACE(std::string(dtype_name(s.act_dtype)) + " " + s.fc1.to_string() + " / " +
               s.fc2.to_string() + ", H " + std::to_string(s.hidden) + ", I " +
               std::to_string(s.inter) + ", E " + std::to_string(s.num_experts) + ", " +
               std::to_string(tokens) + " tokens, tile " + std::to_string(tile));
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed, false, &ti);
  GpuRun mixed, dequant;
  const PrepareOptions generic = with_dispatch("generic");
  PrepareOptions tiled = with_gemm("cutlass", generic);
  tiled.mixed_tile = tile;
  gpu_run(tl, ti, &mixed, tiled);
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

// INT4 and INT8 with zero points (f32 scale and zero term), INT8 without (kInt8: the signed,
// shuffled copy with activation-dtype scales): blocked and per channel, both dtypes.
TEST(GpuMixedLayer, ZeroPointsAndInt8) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int block : {128, 0}) {
      for (bool zp : {true, false}) {
        const LayerSpec s8 =
            spec_of(WeightFormat::kInt8, dt, 256, 128, 16, 4, block, DType::kF32, zp);
        ASSERT_EQ(kind_of(s8, s8.fc1, s8.fc1_rows(), s8.hidden),
                  zp ? cuda::MixedCodes::kInt8Zero : cuda::MixedCodes::kInt8);
        check_mixed_against_dequant(s8, 300);
      }
      const LayerSpec s4 =
          spec_of(WeightFormat::kInt4, dt, 256, 128, 16, 4, block, DType::kF16, true);
      ASSERT_EQ(kind_of(s4, s4.fc1, s4.fc1_rows(), s4.hidden), cuda::MixedCodes::kInt4Zero);
      check_mixed_against_dequant(s4, 333);
    }
    check_mixed_against_dequant(
        spec_of(WeightFormat::kInt8, dt, 256, 128, 64, 2, 64, DType::kBF16, true), 7);
  }
}

// fp8 (one global scale per expert) and fp8_block b128, with FC1 and the gate in one tensor and
// with DeepSeek-V3's separate FC3; fp8_block's scale rows cover 128 of n's rows (n = 320 leaves a
// partial block).
TEST(GpuMixedLayer, Fp8AndFp8Block) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (WeightFormat w : {WeightFormat::kFp8, WeightFormat::kFp8Block}) {
      const int block = w == WeightFormat::kFp8 ? 0 : 128;
      const DType sdt = DType::kF32;
      LayerSpec s = spec_of(w, dt, 256, 128, 16, 4, block, sdt);
      ASSERT_EQ(kind_of(s, s.fc1, s.fc1_rows(), s.hidden), cuda::MixedCodes::kE4m3);
      check_mixed_against_dequant(s, 300);
      LayerSpec f3 = spec_of(w, dt, 384, 320, 16, 4, block, sdt);
      f3.activation.glu = GluLayout::kSeparateFc3;
      check_mixed_against_dequant(f3, 129);
    }
  }
}

// The narrow (32-row), middle (64-row), 128-row and wide (144-row) tile, each forced, on the kinds
// that have them (bf16; the zero kinds too: int4 b128 and int8 per channel with zero points), and
// the automatic choice on each side of its thresholds; f16 has only the 128-row tile,
// which a forced choice of another falls back to. 100 tokens x 4 routes over 16 experts average
// 25 rows (one or two 32-row tiles, the last ragged), 333 average 83 rows; the automatic choice
// takes the narrow tile at 60 tokens (15 rows on average), the middle one (the 128-row one where
// there is none) at 100, the 128-row one at 333 and the wide one at 1100 (275 rows: two ragged
// 144-row tiles, or three 128-row ones, for kinds without it).
TEST(GpuMixedLayer, NarrowMiddleAndTallTiles) {
  QMOE_REQUIRE_GPU();
  using cuda::MixedCodes;
  EXPECT_TRUE(cuda::mixed_has_narrow_tile(MixedCodes::kInt4, DType::kBF16));
  EXPECT_TRUE(cuda::mixed_has_narrow_tile(MixedCodes::kInt8, DType::kBF16));
  EXPECT_TRUE(cuda::mixed_has_narrow_tile(MixedCodes::kInt4Zero, DType::kBF16));
  EXPECT_TRUE(cuda::mixed_has_narrow_tile(MixedCodes::kInt8Zero, DType::kBF16));
  EXPECT_FALSE(cuda::mixed_has_narrow_tile(MixedCodes::kInt8Zero, DType::kF16));
  EXPECT_TRUE(cuda::mixed_has_tile(MixedCodes::kInt4Zero, DType::kBF16, 64));
  EXPECT_FALSE(cuda::mixed_has_tile(MixedCodes::kInt8Zero, DType::kBF16, 64));
  EXPECT_TRUE(cuda::mixed_has_narrow_tile(MixedCodes::kE4m3, DType::kBF16));
  EXPECT_FALSE(cuda::mixed_has_narrow_tile(MixedCodes::kInt4, DType::kF16));
  EXPECT_FALSE(cuda::mixed_has_tile(MixedCodes::kInt4, DType::kBF16, 256));
  EXPECT_TRUE(cuda::mixed_has_tile(MixedCodes::kInt4, DType::kBF16, 64));
  EXPECT_FALSE(cuda::mixed_has_tile(MixedCodes::kInt4, DType::kF16, 64));
  EXPECT_FALSE(cuda::mixed_has_tile(MixedCodes::kInt4, DType::kBF16, 48));
  EXPECT_TRUE(cuda::mixed_has_tile(MixedCodes::kInt8Zero, DType::kF16, 128));
  EXPECT_TRUE(cuda::mixed_has_tile(MixedCodes::kInt4, DType::kBF16, 144));
  EXPECT_TRUE(cuda::mixed_has_tile(MixedCodes::kInt8, DType::kBF16, 144));
  EXPECT_TRUE(cuda::mixed_has_tile(MixedCodes::kE4m3, DType::kBF16, 144));
  EXPECT_FALSE(cuda::mixed_has_tile(MixedCodes::kInt4, DType::kF16, 144));
  EXPECT_TRUE(cuda::mixed_has_tile(MixedCodes::kInt8Zero, DType::kBF16, 144));
  EXPECT_FALSE(cuda::mixed_has_tile(MixedCodes::kInt8Zero, DType::kF16, 144));
  EXPECT_EQ(cuda::mixed_tile_for(1100 * 4, 16), 144);
  const LayerSpec specs[] = {
      int4_spec(DType::kBF16, 256, 128, 16, 4, 128, DType::kF32),
      spec_of(WeightFormat::kInt8, DType::kBF16, 256, 128, 16, 4, 64, DType::kF32),
      spec_of(WeightFormat::kFp8Block, DType::kBF16, 256, 128, 16, 4, 128, DType::kF32),
      int4_spec(DType::kF16, 256, 128, 16, 4, 128, DType::kF32),
      spec_of(WeightFormat::kInt4, DType::kBF16, 256, 128, 16, 4, 128, DType::kF16, true),
      spec_of(WeightFormat::kInt8, DType::kBF16, 256, 128, 16, 4, 0, DType::kF32, true)};
  for (const LayerSpec& s : specs) {
    for (int tile : {32, 64, 128, 144}) {
      check_mixed_against_dequant(s, 100, tile);
      check_mixed_against_dequant(s, 333, tile);
    }
    check_mixed_against_dequant(s, 60);    // automatic: narrow where it exists
    check_mixed_against_dequant(s, 100);   // automatic: 64 rows, or 128
    check_mixed_against_dequant(s, 333);   // automatic: 128 rows
    check_mixed_against_dequant(s, 1100);  // automatic: 144 rows (or 128), ragged tiles
  }
  // Both residencies of the narrow tile in one call (mixed_ctas_per_sm): FC2 (n 2048: 8 tiles x
  // up to 64 experts = 512, two CTAs on up to 256 SMs) and FC1 (n 512: 2 x 64 = 128, one CTA).
  const LayerSpec wide[] = {
      int4_spec(DType::kBF16, 2048, 256, 64, 4, 128, DType::kF32),
      spec_of(WeightFormat::kInt8, DType::kBF16, 2048, 256, 64, 4, 64, DType::kF32),
      spec_of(WeightFormat::kFp8Block, DType::kBF16, 2048, 256, 64, 4, 128, DType::kF32),
      spec_of(WeightFormat::kFp8Block, DType::kF16, 2048, 256, 64, 4, 128, DType::kF32),
      spec_of(WeightFormat::kInt4, DType::kBF16, 2048, 256, 64, 4, 128, DType::kF32, true)};
  EXPECT_EQ(cuda::mixed_ctas_per_sm(32, 2048, 64, 132), 2);
  EXPECT_EQ(cuda::mixed_ctas_per_sm(32, 512, 64, 132), 1);
  for (const LayerSpec& s : wide) {
    check_mixed_against_dequant(s, 100, 32);
    check_mixed_against_dequant(s, 37, 32);  // 148 routes: FC2 8 x 64 at most, fewer touched
  }
  // The narrow tile in graph replay, with the workspace poisoned.
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(specs[0], seed, &tl);
  PrepareOptions o = with_gemm("cutlass", with_dispatch("generic"));
  o.mixed_tile = 32;
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, o, &layer).is_ok());
  check_graph_replay(tl, layer.get(), 101, seed, 2);
  // And at two CTAs per SM (FC2 of the wide layer).
  TestLayer tw;
  make_layer(wide[0], seed, &tw);
  std::unique_ptr<PreparedLayer> wide_layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tw.spec, tw.weights, o, &wide_layer).is_ok());
  check_graph_replay(tw, wide_layer.get(), 100, seed, 2);
}

// The narrow tile's two-CTA instances (cutlass_two_ctas.cuh: 80 registers a thread at launch,
// half the SM's shared memory each) must be held two at once, or their CTAs run one after
// another; the one-CTA ones and the other tiles one. The choice between them by the FC's tiles.
TEST(GpuMixedLayer, NarrowTileHoldsTwoCtasPerSm) {
  QMOE_REQUIRE_GPU();
  using cuda::MixedCodes;
  struct Instance {
    MixedCodes c;
    DType dtype;
    int tile;
    bool act;
    int ctas;
  };
  const Instance instances[] = {{MixedCodes::kInt4, DType::kBF16, 32, false, 2},
                                {MixedCodes::kInt4, DType::kBF16, 32, true, 2},
                                {MixedCodes::kInt8, DType::kBF16, 32, false, 2},
                                {MixedCodes::kInt8, DType::kBF16, 32, true, 2},
                                {MixedCodes::kE4m3, DType::kBF16, 32, false, 2},
                                {MixedCodes::kE4m3, DType::kF16, 32, false, 2},
                                {MixedCodes::kInt4Zero, DType::kBF16, 32, false, 2},
                                {MixedCodes::kInt8Zero, DType::kBF16, 32, false, 2},
                                {MixedCodes::kInt4, DType::kBF16, 32, false, 1},
                                {MixedCodes::kInt4, DType::kBF16, 32, true, 1},
                                {MixedCodes::kE4m3, DType::kF16, 32, false, 1},
                                {MixedCodes::kInt4, DType::kBF16, 64, false, 1},
                                {MixedCodes::kInt4, DType::kBF16, 128, false, 1},
                                {MixedCodes::kInt8Zero, DType::kF16, 128, false, 1}};
  for (const Instance& in : instances) {
    SCOPED_TRACE(std::string(cuda::mixed_codes_name(in.c)) + " " + dtype_name(in.dtype) +
                 ", tile " + std::to_string(in.tile) + (in.act ? ", activation epilogue" : "") +
                 ", " + std::to_string(in.ctas) + " CTAs");
    int resident = 0;
    const Status st =
        cuda::mixed_gemm_residency(in.c, in.dtype, in.tile, in.act, in.ctas, &resident);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_GE(resident, in.ctas);
  }
  int resident = 0;
  const Status none =
      cuda::mixed_gemm_residency(MixedCodes::kInt4, DType::kBF16, 64, false, 2, &resident);
  EXPECT_FALSE(none.is_ok());
  EXPECT_NE(none.message().find("tile_n 64"), std::string::npos) << none.message();
  // Two CTAs where the FC's narrow tiles fill two on every SM (132 SMs: 264 tiles), else one.
  EXPECT_EQ(cuda::mixed_ctas_per_sm(32, 2048, 128, 132), 2);  // qwen3-30b-a3b FC2: 8 x 128
  EXPECT_EQ(cuda::mixed_ctas_per_sm(32, 4096, 8, 132), 1);    // Mixtral FC2: 16 x 8
  EXPECT_EQ(cuda::mixed_ctas_per_sm(32, 28672, 8, 132), 2);   // Mixtral FC1: 112 x 8
  EXPECT_EQ(cuda::mixed_ctas_per_sm(32, 2880, 22, 132), 2);   // 12 x 22 = 264
  EXPECT_EQ(cuda::mixed_ctas_per_sm(32, 2880, 21, 132), 1);   // 12 x 21 = 252
  EXPECT_EQ(cuda::mixed_ctas_per_sm(64, 2048, 128, 132), 1);  // other tiles: one
}

// FC2 in blocks of 32 (below the K tile) runs through the dequantize pass while FC1 runs
// mixed-input in the same call; and a separate FC3, mixed-input like FC1.
TEST(GpuMixedLayer, MixedBesideDequantizeAndSeparateFc3) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    LayerSpec s = int4_spec(dt, 256, 128, 16, 4, 128, DType::kF32);
    s.fc2.block_size = 32;
    std::string why;
    EXPECT_EQ(cuda::mixed_codes_for(s.fc1, dt, s.fc1_rows(), s.hidden, &why),
              cuda::MixedCodes::kInt4)
        << why;
    EXPECT_EQ(kind_of(s, s.fc2, s.hidden, s.inter), cuda::MixedCodes::kNone);
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

// int4 and int8 layers, with and without zero points, keep one copy of their codes: the decode
// path packs them step-major (mma_pack.h), which is the mixed-input GEMM's shuffled order, so
// prepare hands the GEMM the decode path's words (decode_copy_of) and frees ORT's; FC1 takes the
// decode path's GluRows bands (the activation epilogue's on bf16 INT4 / INT8, the activation
// kernel reading banded columns for zero points, f16 and an FC1 bias). The device memory a prepared
// layer holds stays under 1.4x its codes (two copies were 2x and more; the rest is scales, 6-12% at
// b128, zero points' f32 zeros and bytes, and allocation rounding), and both paths still match
// the oracle on it.
TEST(GpuMixedLayer, IntegerLayersKeepOneCopyOfTheCodes) {
  QMOE_REQUIRE_GPU();
  struct Case {
    WeightFormat w;
    DType dt;
    bool zp, bias;
  };
  const Case cases[] = {{WeightFormat::kInt4, DType::kBF16, false, false},
                        {WeightFormat::kInt4, DType::kBF16, true, false},
                        {WeightFormat::kInt4, DType::kF16, true, false},
                        {WeightFormat::kInt4, DType::kBF16, false, true},
                        {WeightFormat::kInt8, DType::kBF16, false, false},
                        {WeightFormat::kInt8, DType::kBF16, true, false}};
  for (const Case& c : cases) {
    const WeightFormat w = c.w;
    LayerSpec s = spec_of(w, c.dt, 2048, 768, 32, 8, 128, DType::kF32, c.zp);
    s.has_fc1_bias = c.bias;
    SCOPED_TRACE(s.fc1.to_string() + " act " + dtype_name(c.dt) + (c.bias ? " FC1 bias" : ""));
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    const double codes = static_cast<double>(s.num_experts) * 3.0 * s.hidden * s.inter *
                         format_info(w).code_bits / 8;
    size_t free0 = 0, free1 = 0, total = 0;
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(cudaMemGetInfo(&free0, &total));
    std::unique_ptr<PreparedLayer> layer;
    const Status st = prepare_layer(BackendKind::kCuda, s, tl.weights, {}, &layer);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    CUDA_ASSERT(cudaMemGetInfo(&free1, &total));
    const double held = static_cast<double>(free0) - static_cast<double>(free1);
    EXPECT_LT(held, 1.4 * codes) << "held " << held / 1e6 << " MB for " << codes / 1e6
                                 << " MB of codes";
    EXPECT_GT(held, codes) << "held " << held / 1e6 << " MB";
    ASSERT_EQ(layer->dispatch_choice(4).rfind("decode", 0), 0u) << layer->dispatch_choice(4);
    ASSERT_EQ(layer->dispatch_choice(256), "generic");
    for (int64_t tokens : {4, 256}) {
      TestInputs ti;
      make_inputs(tl.spec, tokens, seed + static_cast<uint64_t>(tokens), false, &ti);
      GpuRun r;
      gpu_run(tl, ti, &r, {}, 0xFF, true, layer.get());
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_LE(r.error, gpu_budget(s.act_dtype)) << tokens << " tokens";
    }
  }
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
    check_replay_and_poison(tl, layer.get(), seed, 333, 300);
  }
}

// FC1's activation in the mixed-input GEMM's epilogue (PrepareOptions::epilogue_act, the default:
// FC1's copy in GluRows order, the narrow tile activating in its epilogue, the other tiles running
// the activation kernel on the banded columns) against the activation kernel alone (FC1 still
// banded where it shares the decode path's codes, fc1_band_rows; in ORT's order elsewhere), on
// the same layer and inputs: the outputs bitwise equal for every gated case (both FC1 layouts,
// the clamped SwiGLU variants, GeGLU) on bf16 INT4 and INT8, with the automatic tile at 7 (narrow),
// 100 and 333 tokens (taller tiles) and each tile forced. The workspace gains exactly the
// activated rows' term (A(cs R I)) where the layer takes the order; layers it must leave alone (an
// ungated activation, a separate FC3, f16, an FC1 bias, the routing weight applied to the input)
// keep the same workspace.
TEST(GpuMixedLayer, ActivationEpilogueKeepsTheBits) {
  QMOE_REQUIRE_GPU();
  const PrepareOptions on = with_gemm("cutlass", with_dispatch("generic"));
  PrepareOptions off = on;
  off.epilogue_act = false;
  auto workspaces = [](const TestLayer& tl, const PrepareOptions& a, const PrepareOptions& b) {
    std::unique_ptr<PreparedLayer> la, lb;
    EXPECT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, a, &la).is_ok());
    EXPECT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, b, &lb).is_ok());
    return la && lb ? std::make_pair(la->workspace_size(300), lb->workspace_size(300))
                    : std::make_pair(size_t{0}, size_t{0});
  };
  auto same_bits = [&](const TestLayer& tl, int64_t tokens, int tile) {
    SCOPED_TRACE(std::to_string(tokens) + " tokens, tile " + std::to_string(tile));
    TestInputs ti;
    make_inputs(tl.spec, tokens, fresh_seed(), false, &ti);
    PrepareOptions a = on, b = off;
    a.mixed_tile = b.mixed_tile = tile;
    GpuRun fused, kernel;
    gpu_run(tl, ti, &fused, a, 0xFF, /*with_oracle=*/tile == 0 && tokens == 100);
    gpu_run(tl, ti, &kernel, b, 0xFF, false);
    EXPECT_TRUE(fused.out == kernel.out) << "outputs differ";
    if (tile == 0 && tokens == 100) EXPECT_LE(fused.error, gpu_budget(tl.spec.act_dtype));
  };
  for (const ActivationSpec& act : activation_cases()) {
    for (WeightFormat wf : {WeightFormat::kInt4, WeightFormat::kInt8}) {
      LayerSpec s = spec_of(wf, DType::kBF16, 256, 128, 16, 4, 64, DType::kF32);
      s.activation = act;
      SCOPED_TRACE(activation_case_name(act) + " " + s.fc1.to_string());
      TestLayer tl;
      make_layer(s, fresh_seed(), &tl);
      const auto [ws_on, ws_off] = workspaces(tl, on, off);
      const size_t rows = 2 * 300 * 4 * 128;  // A(cs R I) at 300 tokens (a multiple of 256)
      const bool takes = act.gated() && act.glu != GluLayout::kSeparateFc3;
      EXPECT_EQ(ws_on, ws_off + (takes ? rows : 0)) << "takes " << takes;
      for (int64_t tokens : {7, 100, 333}) same_bits(tl, tokens, 0);
      if (act.kind == Activation::kSwiGlu && act.limit > 1e30f) {
        for (int tile : {32, 64, 128, 144}) same_bits(tl, 100, tile);
      }
    }
  }
  // Layers the epilogue leaves to the kernel.
  LayerSpec f16 = int4_spec(DType::kF16, 256, 128, 16, 4, 64, DType::kF32);
  LayerSpec bias = int4_spec(DType::kBF16, 256, 128, 16, 4, 64, DType::kF32);
  bias.has_fc1_bias = true;
  LayerSpec scaled = bias;
  scaled.has_fc1_bias = false;
  scaled.routing.combine = CombineMode::kScaleInput;
  for (const LayerSpec& s : {f16, bias, scaled}) {
    TestLayer tl;
    make_layer(s, fresh_seed(), &tl);
    const auto [ws_on, ws_off] = workspaces(tl, on, off);
    EXPECT_EQ(ws_on, ws_off) << dtype_name(s.act_dtype) << " bias " << s.has_fc1_bias;
    same_bits(tl, 100, 0);
  }
}

// MXFP4 layers (FC biases and H, I multiples of 64, not of 128, as gpt-oss-20b's 2880) on the
// mixed-input GEMM through the e4m3 copy: within the budget and twice the dequantize path's
// error, with nothing left to dequantize (the workspace loses the dequantize scratch). A layer
// whose FC1 holds one inexact chunk (a nonzero code 15 binades below its neighbour block) keeps
// the dequantize path for FC1 (the scratch comes back) and still matches the oracle. bf16 with
// K-packed weights, f16 with ORT's N-packed ones.
TEST(GpuMixedLayer, Mxfp4ThroughItsE4m3Copy) {
  QMOE_REQUIRE_GPU();
  const PrepareOptions generic = with_dispatch("generic");
  auto workspace = [](const TestLayer& tl, const PrepareOptions& o) {
    std::unique_ptr<PreparedLayer> layer;
    EXPECT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, o, &layer).is_ok());
    return layer ? layer->workspace_size(100) : size_t{0};
  };
  for (DType dt : {DType::kBF16, DType::kF16}) {
    LayerSpec s = small_spec(WeightFormat::kMxFp4, 320, 192, 8, 2);
    s.act_dtype = dt;
    s.has_fc1_bias = s.has_fc2_bias = true;
    const bool n_packed = dt == DType::kF16;  // ORT's layout: prepare K-packs it first
    if (n_packed) s.fc1.fp4_layout = s.fc2.fp4_layout = Fp4Layout::kNPacked;
    for (int64_t tokens : {5, 100, 333}) check_mixed_against_dequant(s, tokens);
    check_mixed_against_dequant(s, 100, 32);  // the narrow tile forced
    check_mixed_against_dequant(s, 300, 64);  // the middle one
    TestLayer tl;
    make_layer(s, fresh_seed(), &tl);
    const size_t ws_mixed = workspace(tl, with_gemm("cutlass", generic));
    const size_t ws_dequant = workspace(tl, with_gemm("cutlass-dequant", generic));
    EXPECT_LT(ws_mixed, ws_dequant) << "the copy was not taken";
    if (n_packed) continue;
    // Expert 2, row 5 of FC1: blocks 0 and 1 fifteen binades apart, a 0.5 in block 0.
    const int64_t blocks = s.hidden / 32;
    uint8_t* sc = &tl.fc1.scales[static_cast<size_t>((2 * s.fc1_rows() + 5) * blocks)];
    sc[1] = 130;
    sc[0] = 115;
    tl.fc1.weight[static_cast<size_t>((2 * s.fc1_rows() + 5) * (s.hidden / 2))] = 0x01;
    const size_t ws_widened = workspace(tl, with_gemm("cutlass", generic));
    EXPECT_GT(ws_widened, ws_mixed) << "FC1 should have kept the dequantize path";
    TestInputs ti;
    make_inputs(tl.spec, 100, fresh_seed(), false, &ti);
    GpuRun r;
    gpu_run(tl, ti, &r, with_gemm("cutlass", generic));
    EXPECT_LE(r.error, gpu_budget(dt));
  }
}

// Which FCs the kernel takes, and as which kind (host-only, runs without a device).
// The decode packing of int4 and int8, with and without zero points (mma_pack.h's step-major
// form), is, word for word, the mixed-input GEMM's shuffled copy of the same rows (the host twin
// of the shuffle, over ORT's codes with their top bits flipped): FC2's identity rows and FC1's
// GluRows bands (GluRows::kInterleaved against MmaRowMap::kGatedInterleaved), so that prepare may
// hand the GEMM the decode path's words (decode_copy_of). Host only.
TEST(MixedPrepare, DecodePackingIsTheShuffledOrder) {
  struct Case {
    WeightFormat w;
    bool zp;
  };
  for (const Case c : {Case{WeightFormat::kInt4, false}, Case{WeightFormat::kInt4, true},
                       Case{WeightFormat::kInt8, false}, Case{WeightFormat::kInt8, true}}) {
    for (bool gated : {false, true}) {
      const WeightFormat w = c.w;
      const int64_t E = 3, inter = 24, n = 48, k = w == WeightFormat::kInt4 ? 192 : 96;
      FcFormat f = default_fc_format(w);
      f.block_size = 0;
      f.zero_points = c.zp;
      SCOPED_TRACE(f.to_string() + (gated ? " gated" : " identity"));
      QuantizedFc q;
      make_fc(f, E, n, k, fresh_seed(), &q);
      if (::testing::Test::HasFatalFailure()) return;
      const int bits = f.bits();
      const int64_t row_bytes = k * bits / 8;
      // ORT's rows in the copy's order, each code's top bit flipped (the signed copy).
      std::vector<uint8_t> src(q.weight.size());
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = 0; r < n; ++r) {
          const int64_t from =
              gated ? cuda::glu_source_row(cuda::GluRows::kInterleaved, inter, r) : r;
          for (int64_t b = 0; b < row_bytes; ++b) {
            src[(e * n + r) * row_bytes + b] =
                q.weight[(e * n + from) * row_bytes + b] ^ (bits == 4 ? 0x88 : 0x80);
          }
        }
      }
      std::vector<uint8_t> shuffled(src.size());
      cuda::mixed_shuffle_codes_host(src.data(), shuffled.data(), E, n, k, bits);
      const MmaPackShape s = mma_pack_shape(
          f, n, k, gated ? MmaRowMap::kGatedInterleaved : MmaRowMap::kIdentity, gated ? inter : 0);
      ASSERT_TRUE(mma_step_major(s.codes, s.bits));
      std::vector<uint32_t> words;
      mma_pack_int(s, q.weight.data(), E, &words);
      ASSERT_EQ(words.size() * 4, shuffled.size());
      EXPECT_EQ(std::memcmp(words.data(), shuffled.data(), shuffled.size()), 0);
    }
  }
}

TEST(MixedPrepare, SupportedFormats) {
  using cuda::MixedCodes;
  FcFormat f = default_fc_format(WeightFormat::kInt4);
  for (int block : {0, 64, 128, 256}) {
    f.block_size = block;
    EXPECT_EQ(cuda::mixed_codes_for(f, DType::kBF16, 256, 512), MixedCodes::kInt4) << block;
    EXPECT_EQ(cuda::mixed_codes_for(f, DType::kF16, 256, 512), MixedCodes::kInt4) << block;
    EXPECT_EQ(cuda::mixed_codes_for(f, DType::kF32, 256, 512), MixedCodes::kNone) << block;
  }
  f.block_size = 32;  // below the K tile
  std::string why;
  EXPECT_EQ(cuda::mixed_codes_for(f, DType::kBF16, 256, 512, &why), MixedCodes::kNone);
  EXPECT_NE(why.find("block size 32"), std::string::npos) << why;
  f.block_size = 128;
  EXPECT_EQ(cuda::mixed_codes_for(f, DType::kBF16, 256, 320),
            MixedCodes::kNone);  // 128 does not divide 320
  EXPECT_EQ(cuda::mixed_codes_for(f, DType::kBF16, 252, 512), MixedCodes::kNone);  // n % 8
  f.zero_points = true;
  EXPECT_EQ(cuda::mixed_codes_for(f, DType::kBF16, 256, 512), MixedCodes::kInt4Zero);
  // kInt4Zero is shuffled too: rows the 16-row atom does not tile go to the dequantize path.
  why.clear();
  EXPECT_EQ(cuda::mixed_codes_for(f, DType::kBF16, 248, 512, &why), MixedCodes::kNone);
  EXPECT_NE(why.find("n = 248 not a multiple of 16"), std::string::npos) << why;
  FcFormat i8 = default_fc_format(WeightFormat::kInt8);
  EXPECT_EQ(cuda::mixed_codes_for(i8, DType::kBF16, 256, 512), MixedCodes::kInt8);
  // Rows the shuffle's 16-row atom does not tile: the dequantize path.
  EXPECT_EQ(cuda::mixed_codes_for(i8, DType::kBF16, 200, 512), MixedCodes::kNone);
  i8.zero_points = true;
  EXPECT_EQ(cuda::mixed_codes_for(i8, DType::kF16, 256, 512), MixedCodes::kInt8Zero);
  EXPECT_EQ(cuda::mixed_codes_for(default_fc_format(WeightFormat::kFp8), DType::kBF16, 256, 512),
            MixedCodes::kE4m3);
  FcFormat fb = default_fc_format(WeightFormat::kFp8Block);
  fb.block_size = 128;
  EXPECT_EQ(cuda::mixed_codes_for(fb, DType::kBF16, 200, 512), MixedCodes::kE4m3);
  fb.block_size = 100;
  EXPECT_EQ(cuda::mixed_codes_for(fb, DType::kBF16, 200, 500), MixedCodes::kNone);
  // MXFP4 through its e4m3 copy, chunks of 64 along k (prepare decides whether it is exact).
  const FcFormat mx = default_fc_format(WeightFormat::kMxFp4);
  EXPECT_EQ(cuda::mixed_codes_for(mx, DType::kBF16, 200, 320), MixedCodes::kE4m3);
  EXPECT_EQ(cuda::mixed_codes_for(mx, DType::kF16, 200, 320), MixedCodes::kE4m3);
  EXPECT_EQ(cuda::mixed_chunk(mx, 320), 64);
  EXPECT_EQ(cuda::mixed_codes_for(mx, DType::kBF16, 200, 96), MixedCodes::kNone);  // k % 64
  EXPECT_EQ(cuda::mixed_codes_for(mx, DType::kF32, 200, 320), MixedCodes::kNone);
  EXPECT_EQ(cuda::mixed_codes_for(mx, DType::kBF16, 204, 320), MixedCodes::kNone);  // n % 8
  for (WeightFormat w : {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kNvFp4}) {
    EXPECT_EQ(cuda::mixed_codes_for(default_fc_format(w), DType::kBF16, 256, 512),
              MixedCodes::kNone)
        << default_fc_format(w).to_string();
  }
}

// The prepared copy of every kind, element by element against the library's dequantizer
// (dequantize_row<float>, the documented fp32 formula) on quantized random weights: w evaluated as
// the kernel does (q * s [+ z] in f32; kInt4 and kInt8: the scale rounded to the activation dtype
// first, then the product rounded to it) equals the exact value rounded to the activation dtype.
// The f32 kinds are bitwise equal to it except where -zp * s itself rounds in f32 (one ulp of f32
// before the final rounding); kInt4 and kInt8 are within one activation-dtype rounding of the
// scale.
TEST(MixedPrepare, CopyDequantizesAsTheLibrary) {
  using cuda::MixedCodes;
  const int64_t E = 3, n = 208, k = 256;  // n: kInt4's 16-row multiple, a partial 128-row tile
  for (const FcFormat& f : mixed_test_formats()) {
    for (DType act : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(f.to_string() + " act " + dtype_name(act));
      const MixedCodes kind = cuda::mixed_codes_for(f, act, n, k);
      ASSERT_NE(kind, MixedCodes::kNone);
      QuantizedFc q;
      make_fc(f, E, n, k, fresh_seed(), &q);
      const FcWeights w = q.view();
      cuda::MixedCopy copy;
      cuda::mixed_prepare(kind, f, act, E, n, k, static_cast<const uint8_t*>(w.weight.data),
                          static_cast<const uint8_t*>(w.scales.data),
                          static_cast<const uint8_t*>(w.zero_points.data),
                          static_cast<const float*>(w.global_scale.data), &copy);
      const int64_t kb = k / copy.chunk;
      ASSERT_EQ(copy.scales.size(),
                static_cast<size_t>(E * kb * n * cuda::mixed_scale_bytes(kind)));
      ASSERT_EQ(copy.zeros.size(),
                cuda::mixed_has_zeros(kind) ? static_cast<size_t>(E * kb * n) : 0u);
      const uint8_t* codes =
          copy.codes.empty() ? static_cast<const uint8_t*>(w.weight.data) : copy.codes.data();
      const auto to_act = [act](float v) {
        return act == DType::kBF16 ? num::bf16_to_f32(num::f32_to_bf16(v))
                                   : num::f16_to_f32(num::f32_to_f16(v));
      };
      std::vector<float> ref(static_cast<size_t>(k));
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t r = 0; r < n; ++r) {
          dequantize_row<float>(f, w, n, k, e, r, ref.data());
          for (int64_t i = 0; i < k; ++i) {
            const size_t at = static_cast<size_t>((e * kb + i / copy.chunk) * n + r);
            float s;
            float got;
            if (kind == MixedCodes::kInt4 || kind == MixedCodes::kInt8) {
              uint16_t h;
              std::memcpy(&h, &copy.scales[at * 2], 2);
              s = act == DType::kBF16 ? num::bf16_to_f32(h) : num::f16_to_f32(h);
              int qs;
              if (kind == MixedCodes::kInt4) {
                const uint8_t b = codes[(e * n + r) * (k / 2) + i / 2];
                qs = (b >> (4 * (i & 1))) & 15;
                if (qs >= 8) qs -= 16;
              } else {
                qs = static_cast<int8_t>(codes[(e * n + r) * k + i]);  // q - 128
              }
              got = to_act(static_cast<float>(qs) * s);
              // One rounding of the scale to act: within 2^-8 (bf16) of the exact value.
              const float want = to_act(ref[i]);
              ASSERT_LE(std::abs(got - want), std::abs(want) * 0.008f + 1e-30f)
                  << "e " << e << " r " << r << " k " << i;
              continue;
            }
            std::memcpy(&s, &copy.scales[at * 4], 4);
            float x;
            const uint8_t* row = codes + (e * n + r) * (k * cuda::mixed_code_bits(kind) / 8);
            if (kind == MixedCodes::kInt4Zero) {
              int qs = (row[i / 2] >> (4 * (i & 1))) & 15;
              if (qs >= 8) qs -= 16;
              x = static_cast<float>(qs);
            } else if (kind == MixedCodes::kInt8Zero) {
              x = static_cast<float>(static_cast<int8_t>(row[i]));  // q - 128
            } else {
              x = num::e4m3_to_f32(row[i]);
            }
            const float prod = x * s;
            got = cuda::mixed_has_zeros(kind) ? prod + copy.zeros[at] : prod;
            if (kind == MixedCodes::kE4m3 || f.scale_dtype != DType::kF32) {
              // Exact: e4m3 * s is the library's product; with 16-bit scales (q - mid) * s and
              // (zp - mid) * s are exact in f32, so their difference is (q - zp) * s rounded
              // once.
              ASSERT_EQ(got, ref[i]) << "e " << e << " r " << r << " k " << i;
            } else {
              ASSERT_LE(std::abs(got - ref[i]), std::abs(ref[i]) * 3e-7f + std::abs(prod) * 3e-7f)
                  << "e " << e << " r " << r << " k " << i;
            }
          }
        }
      }
    }
  }
}

// MXFP4's e4m3 copy of quantized weights, both FP4 layouts: exact, and every weight, e4m3(v) * s
// in f32, bitwise the library's dequantizer (dequantize_row<float>).
TEST(MixedPrepare, Mxfp4CopyIsTheDequantizedWeightBitwise) {
  const int64_t E = 3, n = 24, k = 320;
  for (Fp4Layout layout : {Fp4Layout::kKPacked, Fp4Layout::kNPacked}) {
    FcFormat f = default_fc_format(WeightFormat::kMxFp4);
    f.fp4_layout = layout;
    SCOPED_TRACE(layout == Fp4Layout::kKPacked ? "K-packed" : "N-packed");
    QuantizedFc q;
    make_fc(f, E, n, k, fresh_seed(), &q);
    for (float& g : q.global_scale) g = 0.37f;  // a global scale that rounds
    const FcWeights w = q.view();
    cuda::MixedCopy copy;
    cuda::mixed_prepare(cuda::MixedCodes::kE4m3, f, DType::kBF16, E, n, k, q.weight.data(),
                        q.scales.data(), nullptr, q.global_scale.data(), &copy);
    ASSERT_TRUE(copy.exact);
    ASSERT_EQ(copy.chunk, 64);
    ASSERT_EQ(copy.codes.size(), static_cast<size_t>(E * n * k));
    ASSERT_EQ(copy.scales.size(), static_cast<size_t>(E * (k / 64) * n * 4));
    std::vector<float> ref(static_cast<size_t>(k));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < n; ++r) {
        dequantize_row<float>(f, w, n, k, e, r, ref.data());
        for (int64_t i = 0; i < k; ++i) {
          float s;
          std::memcpy(&s, &copy.scales[static_cast<size_t>(((e * (k / 64) + i / 64) * n + r) * 4)],
                      4);
          const float got =
              num::e4m3_to_f32(copy.codes[static_cast<size_t>((e * n + r) * k + i)]) * s;
          ASSERT_EQ(num::f32_bits(got), num::f32_bits(ref[i]))
              << "e " << e << " r " << r << " k " << i;
        }
      }
    }
  }
}

// The scale permutation: every scale lands exactly once, at [e, b, r] from [e, r, b], rounded to
// the activation dtype (kInt4). Scales are distinct small integers (exact in f16 and bf16) so a
// misplaced one shows; the codes are their sources with both nibbles' top bit flipped (q - 8).
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
        cuda::MixedCopy copy;
        cuda::mixed_prepare(cuda::MixedCodes::kInt4, f, act, E, n, k, codes.data(), scales.data(),
                            nullptr, nullptr, &copy);
        ASSERT_EQ(copy.codes.size(), codes.size());
        for (size_t i = 0; i < codes.size(); ++i) {
          for (int half = 0; half < 2; ++half) {
            const int q = (codes[i] >> (4 * half)) & 15;
            int s = (copy.codes[i] >> (4 * half)) & 15;
            if (s >= 8) s -= 16;  // int4 two's complement
            ASSERT_EQ(s, q - 8) << "byte " << i << " nibble " << half;
          }
        }
        ASSERT_EQ(copy.scales.size(), static_cast<size_t>(E * n * kb) * 2);
        ASSERT_TRUE(copy.zeros.empty());
        std::map<int64_t, int> seen;
        for (int64_t e = 0; e < E; ++e) {
          for (int64_t b = 0; b < kb; ++b) {
            for (int64_t r = 0; r < n; ++r) {
              uint16_t h;
              std::memcpy(&h, &copy.scales[((e * kb + b) * n + r) * 2], 2);
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

// The decode kernel (integer FC1/FC2 on tensor cores, up to 64 tokens) against the fp64 oracle
// and against the generic path, over widths (mixed too), zero points, blocks, dtypes, activations,
// routing options and the edges of its window and its passes (1/8/9/16/17/64/65 tokens; 64 routes
// on one expert; a K so long that fewer rows fit a pass).
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "activation_cases.h"
#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

TEST(GpuDecode, IntegerFormatsMatchOracle) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f :
       {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kInt4, WeightFormat::kInt8}) {
    for (int block : {0, 16, 32, 128}) {
      for (bool zp : {false, true}) {
        for (DType dt : {DType::kBF16, DType::kF16}) {
          LayerSpec s = small_spec(f, 256, 128, 16, 4);
          s.act_dtype = dt;
          s.fc1.block_size = s.fc2.block_size = block;
          s.fc1.zero_points = s.fc2.zero_points = zp;
          s.fc1.scale_dtype = block == 32 ? DType::kBF16 : DType::kF32;
          SCOPED_TRACE(s.fc1.to_string() + " " + dtype_name(dt));
          check_gpu_case(s, block == 128 ? 40 : 3);
        }
      }
    }
  }
}

TEST(GpuDecode, MixedWidths) {
  QMOE_REQUIRE_GPU();
  struct Pair {
    WeightFormat fc1, fc2;
    int block1, block2;
  };
  for (const Pair& p : {Pair{WeightFormat::kInt3, WeightFormat::kInt8, 32, 0},
                        Pair{WeightFormat::kInt2, WeightFormat::kInt4, 64, 128},
                        Pair{WeightFormat::kInt8, WeightFormat::kInt3, 0, 16}}) {
    LayerSpec s = small_spec(p.fc1, 256, 128, 16, 4);
    s.fc2 = default_fc_format(p.fc2);
    s.fc1.block_size = p.block1;
    s.fc2.block_size = p.block2;
    s.fc2.zero_points = true;
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE(s.fc1.to_string() + " / " + s.fc2.to_string());
    check_gpu_case(s, 1);
    check_gpu_case(s, 12);
  }
}

TEST(GpuDecode, ActivationsAndBiases) {
  QMOE_REQUIRE_GPU();
  for (const ActivationSpec& a : activation_cases()) {
    if (a.glu == GluLayout::kSeparateFc3 && a.gated()) continue;  // the generic path's case
    LayerSpec s = small_spec(WeightFormat::kInt4);
    s.act_dtype = DType::kBF16;
    s.activation = a;
    s.has_fc1_bias = s.has_fc2_bias = true;
    SCOPED_TRACE(activation_case_name(a));
    check_gpu_case(s, 7);
  }
}

TEST(GpuDecode, RoutingOptions) {
  QMOE_REQUIRE_GPU();
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 9, 1);  // Llama-4 input scaling
    s.act_dtype = DType::kBF16;
    s.routing.method = RoutingMethod::kTopKSigmoid;
    s.routing.combine = CombineMode::kScaleInput;
    s.routing.num_shared = 1;
    s.routing.shared_weight = SharedWeight::kOne;  // Llama-4 adds its shared expert with weight 1
    check_gpu_case(s, 8);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 12, 3);  // shared experts
    s.act_dtype = DType::kF16;
    s.routing.num_shared = 2;
    check_gpu_case(s, 6, /*router_weights=*/true);
    check_gpu_case(s, 30, /*router_weights=*/true);
  }
}

// The windows' edges with E = k = 8 (every token picks every expert, so an expert has as many
// routes as there are tokens); many experts with k = 16; K not a multiple of a chunk or slice.
TEST(GpuDecode, WindowEdgesAndShapes) {
  QMOE_REQUIRE_GPU();
  for (int64_t tokens : {1, 8, 9, 16, 17, 64, 65}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 8, 8);
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE("all experts, tokens " + std::to_string(tokens));
    check_gpu_case(s, tokens);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 128, 64, 512, 16);
    s.fc1.block_size = s.fc2.block_size = 32;
    s.act_dtype = DType::kBF16;
    check_gpu_case(s, 8);
    check_gpu_case(s, 64);
  }
  {
    // K = 8192: fewer than 16 activation rows fit a pass, so 20 routes take two passes.
    LayerSpec s = small_spec(WeightFormat::kInt4, 8192, 128, 8, 8);
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE("H 8192");
    check_gpu_case(s, 20);
  }
  struct Shape {
    WeightFormat f;
    int64_t h, i;
  };
  for (const Shape& sh :
       {Shape{WeightFormat::kInt4, 208, 80}, Shape{WeightFormat::kInt2, 80, 48},
        Shape{WeightFormat::kInt8, 176, 112}, Shape{WeightFormat::kInt3, 240, 96}}) {
    LayerSpec s = small_spec(sh.f, sh.h, sh.i, 8, 2);
    s.fc1.block_size = s.fc2.block_size = 16;
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE(s.fc1.to_string() + " H " + std::to_string(sh.h) + " I " + std::to_string(sh.i));
    check_gpu_case(s, 5);
    check_gpu_case(s, 33);
  }
}

// The two paths agree with each other (within the sum of their budgets) on the same inputs.
// (With MXFP4's power-of-two scales and a global scale of 1 both paths compute with exact weights
// and the outputs often match bit for bit; the override's effect shows on the others.)
TEST(GpuDecode, AgreesWithGenericPath) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    const uint64_t seed = fresh_seed();
    LayerSpec s = small_spec(f, 512, 256, 32, 4);
    s.act_dtype = DType::kBF16;
    s.fc1.zero_points = s.fc2.zero_points = f == WeightFormat::kInt4;
    TestLayer tl;
    make_layer(s, seed, &tl);
    SCOPED_TRACE(s.fc1.to_string());
    for (int64_t tokens : {1, 8, 16, 64}) {
      TestInputs ti;
      make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
      GpuRun fast, generic;
      gpu_run(tl, ti, &fast, with_dispatch("decode/1"));
      gpu_run(tl, ti, &generic, with_dispatch("generic"));
      EXPECT_LE(fast.error, gpu_budget(s.act_dtype)) << tokens << " tokens";
      EXPECT_LE(generic.error, gpu_budget(s.act_dtype)) << tokens << " tokens";
      const double d =
          relative_norm_error(fast.out_f64.data(), generic.out_f64.data(), fast.out_f64.size());
      EXPECT_LE(d, 2 * gpu_budget(s.act_dtype)) << tokens << " tokens";
      if (f != WeightFormat::kMxFp4) EXPECT_GT(d, 0.0) << "the override did not take effect";
    }
  }
}

// Programmatic dependent launch changes when kernels start, never what they compute: the bits
// equal those of plain launches, on both decode kernels and the generic path (its blocked
// routing, plan, gather, setup kernels, CUTLASS GEMMs and activation; the mixed-input GEMM's
// narrow, middle and 128-row tiles at 100, 300 and 600 tokens, and the dequantize pass before the
// CUTLASS grouped GEMM). An aligned input's generic calls on the mixed-input GEMM take the
// routing-written chain, which launches plainly either way; an input 2 bytes off alignment keeps
// the chain with the gather and setup kernels, which PDL still drives.
TEST(GpuDecode, DependentLaunchKeepsTheBits) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  LayerSpec s = small_spec(WeightFormat::kInt4, 512, 256, 32, 4);
  s.act_dtype = DType::kBF16;
  TestLayer tl;
  make_layer(s, seed, &tl);
  for (const char* gemm : {"", "cutlass-dequant"}) {
    for (size_t offset : {size_t{0}, size_t{2}}) {
      for (int64_t tokens : {1, 8, 40, 100, 300, 600}) {
        SCOPED_TRACE(std::string(gemm) + ", input offset " + std::to_string(offset) + ", " +
                     std::to_string(tokens) + " tokens");
        TestInputs ti;
        make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
        GpuRun with, without;
        PrepareOptions pdl = with_gemm(gemm);
        gpu_run(tl, ti, &with, pdl, 0xFF, true, nullptr, offset);
        PrepareOptions no_pdl = pdl;
        no_pdl.pdl = false;
        gpu_run(tl, ti, &without, no_pdl, 0xFF, true, nullptr, offset);
        EXPECT_LE(with.error, gpu_budget(s.act_dtype));
        EXPECT_EQ(with.out, without.out);
      }
    }
  }
}

// Tiles per block: one or two (the warps split each tile's K) or several (a warp per tile over
// all of K, its load ring running across tile ends). Every choice matches the oracle, including
// partial last blocks (tiles not a multiple of the choice: FC2 of H 1040 has 65), passes of more
// than 8 routes, scale blocks shorter than a chunk, zero points and int3; a warp-per-tile layout
// sums in the same order whatever the tiles per block, so those choices agree bit for bit.
TEST(GpuDecode, TilesPerBlockChoices) {
  QMOE_REQUIRE_GPU();
  struct Case {
    WeightFormat f;
    int block;
    bool zp;
    int64_t h, i, e, k;
  };
  for (const Case& c : {Case{WeightFormat::kInt4, 128, true, 1024, 640, 16, 4},
                        Case{WeightFormat::kInt8, 0, false, 512, 384, 8, 2},
                        Case{WeightFormat::kInt2, 32, true, 1024, 768, 16, 4},
                        Case{WeightFormat::kInt3, 64, false, 832, 448, 8, 8},
                        Case{WeightFormat::kInt4, 16, false, 1040, 400, 8, 2}}) {
    LayerSpec s = small_spec(c.f, c.h, c.i, c.e, c.k);
    s.fc1.block_size = s.fc2.block_size = c.block;
    s.fc1.zero_points = s.fc2.zero_points = c.zp;
    s.fc1.scale_dtype = DType::kBF16;
    s.act_dtype = DType::kBF16;
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    for (int64_t tokens : {1, 8, 24}) {
      SCOPED_TRACE(s.fc1.to_string() + " tokens " + std::to_string(tokens));
      TestInputs ti;
      make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
      std::vector<uint8_t> first;
      for (int tpb : {1, 2, 4, 8, 16}) {
        GpuRun r;
        gpu_run(tl, ti, &r, with_tiles(tpb));
        EXPECT_LE(r.error, gpu_budget(s.act_dtype)) << tpb << " tiles per block";
        if (tpb == 4) first = r.out;
        if (tpb > 4) EXPECT_EQ(r.out, first) << tpb << " tiles per block differs from 4";
      }
    }
  }
}

// At one token, on a fresh layer small_spec(f, h, i, e, k) with scale blocks of 128 and bf16
// activations, the decode kernel forced: the launcher's own geometry gives the bits of `forced`
// (options naming the choice the launcher should make), within the budget.
void check_launcher_choice(WeightFormat f, int64_t h, int64_t i, int64_t e, int k,
                           const PrepareOptions& forced) {
  LayerSpec s = small_spec(f, h, i, e, k);
  s.fc1.block_size = s.fc2.block_size = 128;
  s.act_dtype = DType::kBF16;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(std::string(format_info(s.fc1.format).name) + " seed " + std::to_string(seed));
  TestLayer tl;
  make_layer(s, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, 1, seed + 1, false, &ti);
  GpuRun chosen, named;
  gpu_run(tl, ti, &chosen, with_dispatch("decode/1"));
  gpu_run(tl, ti, &named, forced);
  EXPECT_LE(chosen.error, gpu_budget(s.act_dtype));
  EXPECT_EQ(chosen.out, named.out);
}

// The launcher's own choice at one token: two tiles per block where one route per expert gives
// 800 to 1600 (expert, tile) pairs of tiles of at least 8 chunks (both FCs here: 16 x 64 pairs
// of 16 and 8 chunks).
TEST(GpuDecode, LauncherTakesTwoTilesPerBlockAtOneToken) {
  QMOE_REQUIRE_GPU();
  check_launcher_choice(WeightFormat::kInt4, 1024, 512, 32, 16,
                        with_tiles(2, with_dispatch("decode/1")));
}

// FC1 within one wave (at most 800 pairs) of tiles under 16 KB takes two tiles per block too,
// and FC2 over a wave as above: H 1280, I 512, E 32, k 12 gives FC1 12 x 64 = 768 pairs of
// 10 KB tiles (20 chunks; one tile a block before) and FC2 12 x 80 = 960 pairs of 8 chunks.
TEST(GpuDecode, LauncherTakesTwoTilesPerBlockForFc1WithinAWave) {
  QMOE_REQUIRE_GPU();
  check_launcher_choice(WeightFormat::kInt4, 1280, 512, 32, 12,
                        with_tiles(2, with_dispatch("decode/1")));
}

// With one route per expert, a warp's stream of 16 chunks takes the shared-memory ring
// (kSmemRingMinChunksOneRoute): H 4096 int4 gives FC1 tiles of 64 chunks, 16 for each of the 4
// warps splitting one. The launcher's choice gives the register ring's bits.
TEST(GpuDecode, LauncherTakesTheSharedRingForOneRouteStreams) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kFp8Block}) {
    check_launcher_choice(f, 4096, 256, 8, 2, with_ring(1, with_dispatch("decode/1")));
  }
}

// Rows per pass (DecodeOptions::rows): a cap spreads an expert's routes over more passes, but each
// route's sums are its own mma column over the same K order, so every cap gives the uncapped
// bits. At 64 tokens on E = 8, k = 4 an expert has about 32 routes: up to 32 passes.
TEST(GpuDecode, RowsPerPassKeepTheBits) {
  QMOE_REQUIRE_GPU();
  struct Case {
    WeightFormat f;
    int block;
    bool zp;
  };
  for (const Case& c : {Case{WeightFormat::kInt4, 128, true}, Case{WeightFormat::kInt2, 32, false},
                        Case{WeightFormat::kInt3, 64, true}}) {
    LayerSpec s = small_spec(c.f, 512, 384, 8, 4);
    s.fc1.block_size = s.fc2.block_size = c.block;
    s.fc1.zero_points = s.fc2.zero_points = c.zp;
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    for (int64_t tokens : {5, 64}) {
      SCOPED_TRACE(s.fc1.to_string() + " tokens " + std::to_string(tokens) + " seed " +
                   std::to_string(seed));
      TestInputs ti;
      make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
      GpuRun whole;
      gpu_run(tl, ti, &whole);
      EXPECT_LE(whole.error, gpu_budget(s.act_dtype));
      for (int rows : {1, 3}) {
        GpuRun r;
        PrepareOptions o;
        o.decode.rows = rows;
        gpu_run(tl, ti, &r, o);
        EXPECT_LE(r.error, gpu_budget(s.act_dtype)) << rows << " rows per pass";
        EXPECT_EQ(r.out, whole.out) << rows << " rows per pass";
      }
    }
  }
}

// Runs f(tl, ti, options) on a fresh random layer of spec s for 1, 7 and 40 tokens under each
// tiles-per-block setting (options.decode.tiles_per_block over `base`), with a trace naming the
// case and its seed.
template <typename F>
void for_tokens_and_tiles(const LayerSpec& s, std::initializer_list<int> tiles, F&& f,
                          const PrepareOptions& base = {}) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  for (int64_t tokens : {1, 7, 40}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    for (int tpb : tiles) {
      SCOPED_TRACE(s.fc1.to_string() + " " + dtype_name(s.act_dtype) + " tokens " +
                   std::to_string(tokens) + " tiles per block " + std::to_string(tpb) + " seed " +
                   std::to_string(seed));
      f(tl, ti, with_tiles(tpb, base));
    }
  }
}

// The weight ring in registers and in shared memory (DecodeOptions::ring 1|2): the same chunks
// decoded in the same order, so the same bits, within the budget. Every width, zero points, scale
// blocks inside a chunk and spanning chunks, both dtypes, one tile per block (the warps split K)
// and several (a warp's stream crossing tile ends), several passes.
TEST(GpuDecode, RingKindsKeepTheBits) {
  QMOE_REQUIRE_GPU();
  for (const IntCase& c : {IntCase{WeightFormat::kInt4, 128, false, DType::kBF16},
                           IntCase{WeightFormat::kInt2, 16, true, DType::kF16},
                           IntCase{WeightFormat::kInt3, 32, false, DType::kBF16},
                           IntCase{WeightFormat::kInt8, 0, true, DType::kF16}}) {
    LayerSpec s = int_case_spec(c, 1024, 768, 8, 4);
    for_tokens_and_tiles(s, {1, 2, 4, 8},
                         [&](const TestLayer& tl, const TestInputs& ti, const PrepareOptions& o) {
                           GpuRun regs, smem;
                           gpu_run(tl, ti, &regs, with_ring(1, o));
                           gpu_run(tl, ti, &smem, with_ring(2, o));
                           EXPECT_LE(regs.error, gpu_budget(s.act_dtype));
                           EXPECT_LE(smem.error, gpu_budget(s.act_dtype));
                           EXPECT_EQ(smem.out, regs.out);
                         });
  }
}

// The L2 prefetch ahead of the register ring (DecodeOptions::prefetch) is a hint: off, a round and
// far ahead (past every stream's end, which it must clamp), the same bits, within the budget.
TEST(GpuDecode, PrefetchKeepsTheBits) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kInt2}) {
    LayerSpec s = small_spec(f, 1024, 768, 8, 4);
    s.fc1.block_size = s.fc2.block_size = f == WeightFormat::kInt2 ? 64 : 128;
    for_tokens_and_tiles(
        s, {1, 2, 4},
        [&](const TestLayer& tl, const TestInputs& ti, const PrepareOptions& o) {
          GpuRun off, one, far;
          PrepareOptions p = o;
          for (auto [rounds, r] : {std::pair{0, &off}, std::pair{1, &one}, std::pair{16, &far}}) {
            p.decode.prefetch = rounds;
            gpu_run(tl, ti, r, p);
          }
          EXPECT_LE(off.error, gpu_budget(s.act_dtype));
          EXPECT_EQ(one.out, off.out);
          EXPECT_EQ(far.out, off.out);
        },
        with_ring(1));
  }
}

// A non-finite activation on the decode path is reported with its token.
TEST(GpuDecode, NonFiniteInputIsReported) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.act_dtype = DType::kBF16;
  TestLayer tl;
  make_layer(s, seed, &tl);
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer).is_ok());
  TestInputs ti;
  make_inputs(tl.spec, 6, seed, false, &ti);
  store_float(ti.x.data(), DType::kBF16, 4 * s.hidden + 9, std::numeric_limits<float>::infinity());
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(ti, &d));
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(layer->workspace_size(6)));
  ASSERT_TRUE(out.allocate(6 * s.hidden * 2));
  MutableTensorView ov(out.get(), DType::kBF16, {6, s.hidden});
  ASSERT_TRUE(layer->run(d.in, ov, ws.get(), ws.bytes(), nullptr).is_ok());
  const Status st = layer->take_deferred_error();
  EXPECT_NE(st.message().find("input: non-finite value(s), first at token 4"), std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace qmoe::test

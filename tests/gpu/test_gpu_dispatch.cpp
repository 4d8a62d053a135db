// The CUDA backend's dispatch table (src/cuda/layer/dispatch.h): the analytic default, tuned rows,
// a forced choice; then, on a GPU, every choice against the oracle, the decode kernel's
// column-group variants bit for bit against each other, force_dispatch() and its errors, the
// environment read once at prepare, and a tune file applied through PrepareOptions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "cuda/decode/decode_gemv.h"
#include "cuda/layer/dispatch.h"
#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

using cuda::CallPath;
using cuda::choice_name;
using cuda::DispatchChoice;
using cuda::DispatchTable;
using cuda::GenericKind;

std::string chosen(const DispatchTable& t, int64_t tokens) { return choice_name(t.choose(tokens)); }

TEST(Dispatch, AnalyticDefault) {
  const DispatchTable t(true, 8, 128);  // 8 routes per token over 128 experts
  EXPECT_EQ(chosen(t, 1), "decode/1");
  EXPECT_EQ(chosen(t, 8), "decode/1");
  EXPECT_EQ(chosen(t, 64), "decode/1");   // 4 routes per expert on average
  EXPECT_EQ(chosen(t, 256), "decode/1");  // 16: the largest mean past 64 tokens
  EXPECT_EQ(chosen(t, 257), "generic");
  const DispatchTable crowded(true, 8, 8);  // every token on every expert
  EXPECT_EQ(chosen(crowded, 9), "decode/1");
  EXPECT_EQ(chosen(crowded, cuda::kDecodeWindowTokens), "decode/1");  // 64 routes, the window
  EXPECT_EQ(chosen(crowded, cuda::kDecodeWindowTokens + 1), "generic");
  const DispatchTable mixtral(true, 2, 8);
  EXPECT_EQ(chosen(mixtral, 64), "decode/1");  // 16 routes per expert
  EXPECT_EQ(chosen(mixtral, 65), "generic");
  // The generic path reads the codes.
  const DispatchTable no_dequant(true, 8, 128, GenericKind::kReadsCodes);
  EXPECT_EQ(chosen(no_dequant, 128), "decode/1");      // 8 routes per expert
  EXPECT_EQ(chosen(no_dequant, 129), "generic");
  EXPECT_EQ(chosen(no_dequant, 64), "decode/1");  // the 64-token window stays
  const DispatchTable wide(true, 8, 1 << 14);     // the window never passes the kernel's bound
  EXPECT_EQ(chosen(wide, cuda::kDecodeMaxRoutes), "decode/1");
  EXPECT_EQ(chosen(wide, cuda::kDecodeMaxRoutes + 1), "generic");
  const DispatchTable none(false, 8, 128);
  EXPECT_EQ(chosen(none, 1), "generic");
  // Large experts: the window ends at 1.7 expected routes per touched expert, 1.12 for grouped
  // top-k. deepseek-v3 (grouped, 8 of 256, 44 MB experts): 8 tokens 1.116, 9 tokens 1.132;
  // Mixtral (2 of 8, 94 MB): 5 tokens 1.64, 6 tokens 1.82. Experts just under the size keep the
  // window above.
  const int64_t large = cuda::kDecodeLargeExpertBytes;
  const DispatchTable deepseek(true, 8, 256, GenericKind::kReadsCodes, 0,
                               44 * (int64_t{1} << 20), true);
  EXPECT_EQ(chosen(deepseek, 1), "decode/1");
  EXPECT_EQ(chosen(deepseek, 8), "decode/1");
  EXPECT_EQ(chosen(deepseek, 9), "generic");
  EXPECT_EQ(chosen(deepseek, 12), "generic");
  EXPECT_EQ(chosen(deepseek, 64), "generic");
  const DispatchTable ungrouped(true, 8, 256, GenericKind::kReadsCodes, 0,
                                44 * (int64_t{1} << 20));  // the same shape, top-k routing
  EXPECT_EQ(chosen(ungrouped, 12), "decode/1");            // 1.18
  EXPECT_EQ(chosen(ungrouped, 64), "generic");             // 2.30
  const DispatchTable big_mixtral(true, 2, 8, GenericKind::kReadsCodes, 0,
                                  94 * (int64_t{1} << 20));
  EXPECT_EQ(chosen(big_mixtral, 1), "decode/1");
  EXPECT_EQ(chosen(big_mixtral, 5), "decode/1");
  EXPECT_EQ(chosen(big_mixtral, 6), "generic");
  // slots >= experts
  const DispatchTable all_touched(true, 8, 8, GenericKind::kReadsCodes, 0, large);
  EXPECT_EQ(chosen(all_touched, 1), "decode/1");  // one route per expert
  EXPECT_EQ(chosen(all_touched, 2), "generic");   // two
  const DispatchTable just_under(true, 8, 256, GenericKind::kReadsCodes, 0, large - 1);
  EXPECT_EQ(chosen(just_under, 64), "decode/1");
  // Every FC on the narrow tile: no 64-token floor; 5 routes per expert for 4-bit codes (80
  // tokens of qwen3-30b-a3b), 2 for 8-bit ones (32 tokens).
  const DispatchTable narrow4(true, 8, 128, GenericKind::kNarrow4);
  EXPECT_EQ(chosen(narrow4, 1), "decode/1");
  EXPECT_EQ(chosen(narrow4, 80), "decode/1");
  EXPECT_EQ(chosen(narrow4, 81), "generic");
  const DispatchTable narrow8(true, 8, 128, GenericKind::kNarrow8);
  EXPECT_EQ(chosen(narrow8, 32), "decode/1");
  EXPECT_EQ(chosen(narrow8, 33), "generic");
  EXPECT_EQ(chosen(narrow8, 64), "generic");
  // The same with zero points: 8 routes per expert for 4-bit codes (128 tokens), 4 for 8-bit
  // ones (64 tokens).
  const DispatchTable zero4(true, 8, 128, GenericKind::kZero4);
  EXPECT_EQ(chosen(zero4, 1), "decode/1");
  EXPECT_EQ(chosen(zero4, 128), "decode/1");
  EXPECT_EQ(chosen(zero4, 129), "generic");
  const DispatchTable zero8(true, 8, 128, GenericKind::kZero8);
  EXPECT_EQ(chosen(zero8, 64), "decode/1");
  EXPECT_EQ(chosen(zero8, 65), "generic");
  EXPECT_EQ(chosen(zero8, 128), "generic");
  // MXFP4 through its e4m3 copy on the narrow tile: 6 routes per expert for small experts
  // (qwen3.6-35b-a3b, 1.7 MB: 192 tokens), 3 from 8 MiB on (gpt-oss-20b, 13.2 MB: 24 tokens).
  const DispatchTable e4m3_small(true, 8, 256, GenericKind::kE4m3Copy, 0, 1750000);
  EXPECT_EQ(chosen(e4m3_small, 1), "decode/1");
  EXPECT_EQ(chosen(e4m3_small, 192), "decode/1");
  EXPECT_EQ(chosen(e4m3_small, 193), "generic");
  const DispatchTable e4m3_large(true, 4, 32, GenericKind::kE4m3Copy, 0, 13200000);
  EXPECT_EQ(chosen(e4m3_large, 24), "decode/1");
  EXPECT_EQ(chosen(e4m3_large, 25), "generic");
  EXPECT_EQ(chosen(e4m3_large, 64), "generic");
  const DispatchTable e4m3_edge(true, 4, 32, GenericKind::kE4m3Copy, 0,
                                cuda::kE4m3CopyLargeExpertBytes - 1);
  EXPECT_EQ(chosen(e4m3_edge, 48), "decode/1");  // 6 routes per expert below the size
  EXPECT_EQ(chosen(e4m3_edge, 49), "generic");
  // MXFP4 with FP8 activations: 4 routes per expert for small experts (qwen3.6: 128 tokens), the
  // large experts' 3 (gpt-oss-20b: 24 tokens).
  const DispatchTable fp8_small(true, 8, 256, GenericKind::kE4m3Fp8, 0, 1750000);
  EXPECT_EQ(chosen(fp8_small, 128), "decode/1");
  EXPECT_EQ(chosen(fp8_small, 129), "generic");
  const DispatchTable fp8_large(true, 4, 32, GenericKind::kE4m3Fp8, 0, 13200000);
  EXPECT_EQ(chosen(fp8_large, 24), "decode/1");
  EXPECT_EQ(chosen(fp8_large, 25), "generic");
  // The large-expert rule still applies (deepseek-v3's FP8 weights on the narrow tile).
  const DispatchTable narrow_large(true, 8, 256, GenericKind::kNarrow8, 0,
                                   44 * (int64_t{1} << 20), true);
  EXPECT_EQ(chosen(narrow_large, 8), "decode/1");
  EXPECT_EQ(chosen(narrow_large, 9), "generic");
}

// The mixed-input GEMM's tile by the call's average routes per expert (routes / E), at each
// threshold and one past it: qwen3-30b-a3b's 128 experts, top 8.
TEST(Dispatch, MixedTileByRoutesPerExpert) {
  const int64_t e = 128;
  EXPECT_EQ(cuda::mixed_tile_for(1, e), 32);
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutes * e, e), 32);  // 384 tokens
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutes * e + 1, e), 64);
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedMidRoutes * e, e), 64);  // 768 tokens
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedMidRoutes * e + 1, e), 128);
  EXPECT_EQ(cuda::mixed_tile_for(512 * e, e), 128);  // 8192 tokens: 576 rows either way
  // The wide tile where the 128-row one spills a tail into one more tile, by at least
  // kMixedWideMinGain fewer rows: from about 120 routes per expert, and around 256 (qwen3-30b-a3b
  // at 4096 tokens: 318 rows against 291), not at 384 (447 against 433: 3.1%).
  EXPECT_EQ(cuda::mixed_tile_for(112 * e, e), 128);
  EXPECT_EQ(cuda::mixed_tile_for(120 * e, e), 144);
  EXPECT_EQ(cuda::mixed_tile_for(128 * e, e), 144);  // DeepSeek-V3's 4096 tokens, E 256 top 8
  EXPECT_EQ(cuda::mixed_tile_for(256 * e, e), 144);
  EXPECT_EQ(cuda::mixed_tile_for(384 * e, e), 128);
  EXPECT_EQ(cuda::mixed_tile_for(128 * e, e, 0), 144);
  // fp8 (mid_routes 0): never the middle tile.
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutes * e, e, 0), 32);
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutes * e + 1, e, 0), 128);
  // A layer of few experts (mixtral-8x7b: 8, top 2) leaves the narrow tile sooner.
  const int64_t f = 8;
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutesFew * f, f), 32);  // 80 tokens
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutesFew * f + 1, f), 64);
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedMidRoutes * f, f), 64);  // 192 tokens
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedMidRoutes * f + 1, f), 128);
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutesFew * f + 1, f, 0), 128);
  const int64_t few_edge = cuda::kMixedFewExperts;  // the first count that keeps the bounds
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutes * few_edge, few_edge), 32);
  EXPECT_EQ(cuda::mixed_tile_for(cuda::kMixedNarrowRoutes * (few_edge - 1), few_edge - 1), 64);
  static_assert(cuda::kMixedNarrowRoutesFew < cuda::kMixedNarrowRoutes &&
                    cuda::kMixedNarrowRoutes < cuda::kMixedMidRoutes,
                "the tiles grow with the routes per expert");
}

// The expected rows a call's tiles run per expert: exact where every expert holds the mean
// (one expert), and at a multinomial's spread the sum over j of P(r > j N) N, checked against a
// direct sum over the binomial's probabilities.
TEST(Dispatch, PaddedRowsOfATile) {
  EXPECT_DOUBLE_EQ(cuda::mixed_padded_rows(100, 1, 128), 128.0);
  EXPECT_DOUBLE_EQ(cuda::mixed_padded_rows(129, 1, 128), 256.0);
  EXPECT_DOUBLE_EQ(cuda::mixed_padded_rows(0, 8, 128), 0.0);
  const int64_t e = 128;
  for (int64_t mean : {64, 120, 128, 256}) {
    for (int tile : {128, 144}) {
      const int64_t routes = mean * e;
      const double p = 1.0 / e;
      double want = 0.0, log_pmf = routes * std::log1p(-p);  // P(r = 0)
      for (int64_t r = 0; r <= 3 * mean; ++r) {
        if (r > 0) log_pmf += std::log(double(routes - r + 1) / r) + std::log(p / (1 - p));
        want += std::exp(log_pmf) * ((r + tile - 1) / tile) * tile;
      }
      SCOPED_TRACE(std::to_string(mean) + " routes per expert, tile " + std::to_string(tile));
      EXPECT_NEAR(cuda::mixed_padded_rows(routes, e, tile), want, 0.01 * want);
    }
  }
}

TEST(Dispatch, TunedRowsReplaceTheDefaultUpToTheirLastRow) {
  DispatchTable t(true, 8, 128);
  // Each row differs from the analytic default (decode/1 up to 64 tokens, then up to 16 routes
  // per expert, 256 tokens here; generic past that).
  ASSERT_TRUE(t.apply_tuned({{2, "generic"}, {16, "decode/1"}, {100, "generic"}}).is_ok());
  EXPECT_EQ(chosen(t, 1), "generic");
  EXPECT_EQ(chosen(t, 3), "decode/1");
  EXPECT_EQ(chosen(t, 16), "decode/1");
  EXPECT_EQ(chosen(t, 17), "generic");
  EXPECT_EQ(chosen(t, 100), "generic");
  EXPECT_EQ(chosen(t, 101), "decode/1");  // past the rows: the analytic default
  EXPECT_EQ(chosen(t, 300), "generic");
  ASSERT_TRUE(t.apply_tuned({{cuda::kDecodeMaxRoutes + 10, "decode/1"}}).is_ok());
  EXPECT_EQ(chosen(t, cuda::kDecodeMaxRoutes), "decode/1");
  EXPECT_EQ(chosen(t, cuda::kDecodeMaxRoutes + 1), "generic");  // past the decode kernel's bound
  // Unknown and deleted choices (decode/2, decode/cc) are refused, naming the value.
  for (const char* gone : {"decode/3", "decode/2", "decode/cc"}) {
    const Status bad = t.apply_tuned({{4, gone}});
    EXPECT_FALSE(bad.is_ok()) << gone;
    EXPECT_NE(bad.message().find(gone), std::string::npos) << bad.message();
    EXPECT_NE(bad.message().find("generic, decode/1, fused"), std::string::npos)
        << bad.message();
  }
  // A row may name the generic path's tile; tiles that do not exist are refused.
  ASSERT_TRUE(t.apply_tuned({{4, "decode/1"}, {100, "generic/64"}}).is_ok());
  EXPECT_EQ(chosen(t, 4), "decode/1");
  EXPECT_EQ(chosen(t, 50), "generic/64");
  EXPECT_EQ(chosen(t, 101), "decode/1");  // past the rows: the default
  for (const char* gone : {"generic/48", "generic/", "generic/256", "generic/064"}) {
    EXPECT_FALSE(t.apply_tuned({{4, gone}}).is_ok()) << gone;
  }
  EXPECT_FALSE(t.apply_tuned({{4, "generic"}, {4, "generic"}}).is_ok());
}

TEST(Dispatch, ForcedChoice) {
  DispatchTable t(true, 8, 128);
  const DispatchChoice decode{CallPath::kDecode};
  t.force(&decode);
  EXPECT_EQ(chosen(t, 1), "decode/1");
  EXPECT_EQ(chosen(t, 1000), "decode/1");  // the default: generic
  EXPECT_EQ(chosen(t, cuda::kDecodeMaxRoutes + 1), "generic");  // past the decode kernel's bound
  ASSERT_TRUE(t.apply_tuned({{4, "generic"}}).is_ok());
  EXPECT_EQ(chosen(t, 1), "decode/1");  // the forced choice beats the tuned rows
  t.force(nullptr);
  EXPECT_EQ(chosen(t, 1), "generic");
  EXPECT_EQ(chosen(t, 5), "decode/1");
  EXPECT_EQ(chosen(t, 1000), "generic");
  DispatchTable none(false, 8, 128);
  none.force(&decode);
  EXPECT_EQ(chosen(none, 1), "generic");  // no decode path: the generic one
  // The names options are checked against (qmoe/tuning.h) are exactly the table's choices.
  std::vector<std::string> names;
  for (const DispatchChoice& c : cuda::layer_choices(true, 16, {32, 64, 128, 144})) {
    names.push_back(choice_name(c));
    DispatchChoice back;
    ASSERT_TRUE(cuda::parse_choice(names.back(), &back));
    EXPECT_EQ(back, c);
  }
  EXPECT_EQ(names, dispatch_choice_names());
  EXPECT_EQ(cuda::layer_choices(false).size(), 1u);
  EXPECT_EQ(cuda::layer_choices(true).size(), 2u);            // no fused kernel on the layer
  EXPECT_EQ(cuda::layer_choices(false, 16).size(), 2u);       // generic and fused
  EXPECT_EQ(cuda::dispatch_candidates(true, 4).size(), 2u);   // generic, decode/1
  EXPECT_EQ(cuda::dispatch_candidates(true, 12).size(), 2u);
  EXPECT_EQ(cuda::dispatch_candidates(false, 12).size(), 1u);
  EXPECT_EQ(cuda::dispatch_candidates(true, cuda::kDecodeMaxRoutes).size(), 2u);
  EXPECT_EQ(cuda::dispatch_candidates(true, cuda::kDecodeMaxRoutes + 1).size(), 1u);
  // A forced tile stays on the generic path at every count.
  DispatchChoice tile64;
  ASSERT_TRUE(cuda::parse_choice("generic/64", &tile64));
  EXPECT_EQ(tile64.path, CallPath::kGeneric);
  EXPECT_EQ(tile64.tile, 64);
  t.force(&tile64);
  EXPECT_EQ(chosen(t, 1), "generic/64");
  EXPECT_EQ(chosen(t, 5000), "generic/64");
}

// A layer whose mixed-input copies have several tiles offers one generic candidate per tile in
// place of "generic" (what the tuner times), and takes "generic" too when forced.
TEST(Dispatch, TileChoices) {
  const auto names = [](const std::vector<DispatchChoice>& v) {
    std::string s;
    for (const DispatchChoice& c : v) s += choice_name(c) + " ";
    return s;
  };
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 4, 16, {32, 64, 128})),
            "generic/32 generic/64 generic/128 decode/1 fused ");
  EXPECT_EQ(names(cuda::dispatch_candidates(false, 300, 0, {32, 128})), "generic/32 generic/128 ");
  EXPECT_EQ(names(cuda::layer_choices(true, 0, {32, 128})),
            "generic decode/1 generic/32 generic/128 ");
  EXPECT_EQ(names(cuda::layer_choices(false)), "generic ");
}

// The fused kernel: a candidate up to the layer's bound, never where the layer lacks it; forced
// past the bound (or on a layer without it), the decode kernel or the generic path.
TEST(Dispatch, FusedChoice) {
  const DispatchTable t(true, 8, 128, GenericKind::kDequantize, 16);
  const auto names = [](const std::vector<DispatchChoice>& v) {
    std::string s;
    for (const DispatchChoice& c : v) s += choice_name(c) + " ";
    return s;
  };
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 1, 16)), "generic decode/1 fused ");
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 16, 16)), "generic decode/1 fused ");
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 17, 16)), "generic decode/1 ");
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 4, 0)), "generic decode/1 ");
  DispatchChoice c;
  EXPECT_FALSE(cuda::parse_choice("decode/cc", &c));  // the CUDA-core form was deleted
  EXPECT_FALSE(cuda::parse_choice("decode/2", &c));   // and the two-group form
  ASSERT_TRUE(cuda::parse_choice("fused", &c));
  EXPECT_EQ(c.path, CallPath::kFused);
  {
    DispatchTable forced = t, no_fused(true, 8, 128), none(false, 8, 128);
    for (DispatchTable* f : {&forced, &no_fused, &none}) f->force(&c);
    EXPECT_EQ(chosen(forced, 1), "fused");
    EXPECT_EQ(chosen(forced, 16), "fused");
    EXPECT_EQ(chosen(forced, 17), "decode/1");
    EXPECT_EQ(chosen(no_fused, 1), "decode/1");
    EXPECT_EQ(chosen(none, 1), "generic");
  }
  DispatchTable tuned(true, 8, 128, GenericKind::kDequantize, 16);
  ASSERT_TRUE(tuned.apply_tuned({{8, "fused"}, {64, "fused"}}).is_ok());
  EXPECT_EQ(chosen(tuned, 8), "fused");
  EXPECT_EQ(chosen(tuned, 20), "decode/1");  // a row past the bound: the decode kernel
}

// Rows per pass on the decode path: four times the mean routes per expert, to the nearest power
// of two in [2, 16]; the token count's bound (0) with shared experts.
TEST(Dispatch, DecodeRowsPerPass) {
  EXPECT_EQ(cuda::decode_rows_per_pass(1, 8, 0, 128), 2);    // qwen3-30b-a3b
  EXPECT_EQ(cuda::decode_rows_per_pass(8, 8, 0, 128), 2);    // mean 0.5
  EXPECT_EQ(cuda::decode_rows_per_pass(16, 8, 0, 128), 4);   // mean 1
  EXPECT_EQ(cuda::decode_rows_per_pass(64, 8, 0, 128), 16);  // mean 4: the launcher's 8
  EXPECT_EQ(cuda::decode_rows_per_pass(8, 10, 0, 512), 2);   // E 512, k 10: mean 0.16
  EXPECT_EQ(cuda::decode_rows_per_pass(64, 10, 0, 512), 4);  // mean 1.25: 5 is nearer 4 than 8
  EXPECT_EQ(cuda::decode_rows_per_pass(4, 2, 0, 8), 4);      // Mixtral: mean 1
  EXPECT_EQ(cuda::decode_rows_per_pass(8, 2, 0, 8), 8);      // mean 2
  EXPECT_EQ(cuda::decode_rows_per_pass(8, 8, 1, 129), 0);    // a shared expert takes all 8
  EXPECT_EQ(cuda::decode_rows_per_pass(0, 8, 0, 128), 0);
}

// Every choice within budget, forced at every token count (decode/1 runs several passes past 8
// routes per expert; fused falls back to decode/1 past its window; the generic path on each
// tile of the layer's mixed-input copy, the narrow one with FC1's activation in its epilogue).
TEST(GpuDispatch, EveryChoiceMatchesOracle) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 8, 8);  // every token on every expert
  s.act_dtype = DType::kBF16;
  TestLayer tl;
  make_layer(s, seed, &tl);
  for (int64_t tokens : {1, 8, 12, 40}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    for (const char* name : {"generic", "decode/1", "fused", "generic/32", "generic/64",
                             "generic/128", "generic/144"}) {
      GpuRun run;
      gpu_run(tl, ti, &run, with_dispatch(name));
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_LE(run.error, gpu_budget(s.act_dtype)) << name << ", " << tokens << " tokens";
    }
  }
}

// Past the analytic default's window the decode kernel still takes a call when a tune file or a
// forced choice asks for it: experts with many more routes than a pass holds (16) run several
// passes. 8 experts of 8 routes per token: every expert takes every token.
TEST(GpuDispatch, DecodePastTheDefaultWindow) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 8, 8);
  s.act_dtype = DType::kBF16;
  TestLayer tl;
  make_layer(s, seed, &tl);
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer).is_ok());
  for (int64_t tokens : {cuda::kDecodeWindowTokens + 1, int64_t{200}, int64_t{1000}}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    GpuRun one;
    ASSERT_TRUE(layer->force_dispatch("decode/1").is_ok());
    EXPECT_EQ(layer->dispatch_choice(tokens), "decode/1") << tokens << " tokens";
    gpu_run(tl, ti, &one, {}, 0xFF, true, layer.get());
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_LE(one.error, gpu_budget(s.act_dtype)) << tokens << " tokens";
  }
}

// A small int4 bf16 layer (the decode path takes it).
void small_bf16_layer(TestLayer* tl) {
  LayerSpec s = small_spec(WeightFormat::kInt4);
  s.act_dtype = DType::kBF16;
  make_layer(s, fresh_seed(), tl);
}

// A forced choice that is not this layer's is refused, naming it, and leaves the dispatch as it
// was; "" returns to the table; a tune file applied later keeps the forced choice.
TEST(GpuDispatch, ForceDispatchOnPreparedLayer) {
  QMOE_REQUIRE_GPU();
  TestLayer tl;
  small_bf16_layer(&tl);
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer).is_ok());
  ASSERT_EQ(layer->dispatch_choice(2), "decode/1");
  ASSERT_TRUE(layer->force_dispatch("generic").is_ok());
  EXPECT_EQ(layer->dispatch_choice(2), "generic");
  Status st = layer->force_dispatch("decode/9");
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("force_dispatch"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("decode/9"), std::string::npos) << st.message();
  EXPECT_EQ(layer->dispatch_choice(2), "generic") << "a refused choice changed the dispatch";
  ASSERT_TRUE(layer->apply_tune_file("").is_ok());
  EXPECT_EQ(layer->dispatch_choice(2), "generic") << "a tune file dropped the forced choice";
  ASSERT_TRUE(layer->force_dispatch("").is_ok());
  EXPECT_EQ(layer->dispatch_choice(2), "decode/1");
  ASSERT_TRUE(layer->force_dispatch("generic/32").is_ok());  // its mixed-input copy's tiles
  EXPECT_EQ(layer->dispatch_choice(2), "generic/32");
  ASSERT_TRUE(layer->force_dispatch("").is_ok());

  // f32 activations: no decode path, so a decode choice is not this layer's.
  LayerSpec f32 = small_spec(WeightFormat::kInt4);
  f32.act_dtype = DType::kF32;
  TestLayer tf;
  make_layer(f32, fresh_seed(), &tf);
  std::unique_ptr<PreparedLayer> plain;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tf.spec, tf.weights, {}, &plain).is_ok());
  ASSERT_EQ(plain->dispatch_candidates(4).size(), 1u);
  st = plain->force_dispatch("decode/1");
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not a path of this layer"), std::string::npos) << st.message();
  EXPECT_TRUE(plain->force_dispatch("generic").is_ok());
  st = plain->force_dispatch("generic/64");  // no mixed-input copy, so no tiles to name
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not a path of this layer"), std::string::npos) << st.message();
  // At prepare, the same choice is no error: the layer's calls run the generic path.
  ASSERT_TRUE(
      prepare_layer(BackendKind::kCuda, tf.spec, tf.weights, with_dispatch("decode/1"), &plain)
          .is_ok());
  EXPECT_EQ(plain->dispatch_choice(4), "generic");
}

// The environment is read once, at prepare: QMOE_DISPATCH (and QMOE_CUDA_PATH=generic) set then
// forces the choice, changing it afterwards changes nothing, a bad value fails prepare naming the
// variable, and an explicit PrepareOptions::dispatch wins over it.
TEST(GpuDispatch, EnvironmentReadOnceAtPrepare) {
  QMOE_REQUIRE_GPU();
  TestLayer tl;
  small_bf16_layer(&tl);
  std::unique_ptr<PreparedLayer> layer;
  {
    EnvOverride o("QMOE_DISPATCH", "generic");
    ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer).is_ok());
  }
  EXPECT_EQ(layer->dispatch_choice(2), "generic");
  {
    EnvOverride o("QMOE_DISPATCH", "decode/1");
    EXPECT_EQ(layer->dispatch_choice(2), "generic") << "the environment was read after prepare";
    std::unique_ptr<PreparedLayer> other;
    ASSERT_TRUE(
        prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, with_dispatch("generic"), &other)
            .is_ok());
    EXPECT_EQ(other->dispatch_choice(2), "generic") << "the variable overrode an explicit choice";
  }
  {
    EnvOverride o("QMOE_CUDA_PATH", "generic");
    ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer).is_ok());
    EXPECT_EQ(layer->dispatch_choice(2), "generic");
  }
  {
    EnvOverride o("QMOE_DISPATCH", "decode/9");
    std::unique_ptr<PreparedLayer> bad;
    const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &bad);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("QMOE_DISPATCH"), std::string::npos) << st.message();
    EXPECT_FALSE(bad);
  }
  {
    EnvOverride o("QMOE_DECODE_TPB", "3");
    std::unique_ptr<PreparedLayer> bad;
    const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &bad);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("QMOE_DECODE_TPB"), std::string::npos) << st.message();
  }
}

// A small int4 bf16 layer, a fresh temporary tune-file path, and the tune key of the layer on
// device 0.
struct TuneFixture {
  TestLayer tl;
  std::string path;
  std::string key;
};
void tune_fixture(TuneFixture* f) {
  small_bf16_layer(&f->tl);
  cudaDeviceProp prop;
  CUDA_ASSERT(cudaGetDeviceProperties(&prop, 0));
  f->path = ::testing::TempDir() + "qmoe_dispatch_" + std::to_string(fresh_seed()) + ".json";
  f->key = tune_key(f->tl.spec, prop.name);
}

TEST(GpuDispatch, TuneFileAppliesThroughPrepareOptions) {
  QMOE_REQUIRE_GPU();
  TuneFixture f;
  tune_fixture(&f);
  const TestLayer& tl = f.tl;
  const LayerSpec& s = tl.spec;
  const std::string& path = f.path;
  ASSERT_TRUE(save_tuned_rows(path, f.key, {{4, "generic"}}).is_ok());
  PrepareOptions opt;
  opt.tune_file = path;
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, opt, &layer).is_ok());
  EXPECT_EQ(layer->dispatch_choice(1), "generic");
  EXPECT_EQ(layer->dispatch_choice(4), "generic");
  EXPECT_EQ(layer->dispatch_choice(5), "decode/1");
  // A bf16 int4 layer's mixed-input copy has all four tiles: a generic candidate each.
  const std::vector<std::string> want = {"generic/32",  "generic/64", "generic/128",
                                         "generic/144", "decode/1",   "fused"};
  EXPECT_EQ(layer->dispatch_candidates(12), want);
  TestInputs ti;
  make_inputs(tl.spec, 3, fresh_seed(), false, &ti);
  GpuRun r;
  gpu_run(tl, ti, &r, {}, 0xFF, true, layer.get());
  EXPECT_LE(r.error, gpu_budget(s.act_dtype));
  std::remove(path.c_str());
  opt.tune_file = path + ".absent";  // no file: the default
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, opt, &layer).is_ok());
  EXPECT_EQ(layer->dispatch_choice(1), "decode/1");
}

// A prepared layer takes a tune file later (qmoe bench --tune), and keeps its table when the file
// is malformed.
TEST(GpuDispatch, TuneFileAppliesToPreparedLayer) {
  QMOE_REQUIRE_GPU();
  TuneFixture f;
  tune_fixture(&f);
  const std::string& path = f.path;
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, f.tl.spec, f.tl.weights, {}, &layer).is_ok());
  EXPECT_EQ(layer->dispatch_choice(1), "decode/1");
  ASSERT_TRUE(save_tuned_rows(path, f.key, {{2, "generic"}}).is_ok());
  ASSERT_TRUE(layer->apply_tune_file(path).is_ok());
  EXPECT_EQ(layer->dispatch_choice(1), "generic");
  EXPECT_EQ(layer->dispatch_choice(3), "decode/1");
  {
    std::ofstream bad(path);
    bad << "{ not json";
  }
  EXPECT_FALSE(layer->apply_tune_file(path).is_ok());
  EXPECT_EQ(layer->dispatch_choice(1), "generic") << "a failed load changed the table";
  ASSERT_TRUE(layer->apply_tune_file("").is_ok());
  EXPECT_EQ(layer->dispatch_choice(1), "decode/1");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace qmoe::test

// FC2 with the combine (DecodeOptions::combine): a cluster of FC2 blocks per token (one route
// each) hands its sums to its first block, which adds the token's slots as the finalize kernel
// does; no finalize kernel runs. Its bits are those of FC2 with the same tiles per block followed
// by the finalize kernel, which these tests compare bit for bit, over every kind of codes and
// scale-block layout, 1 to 3 tokens, one, two and four tiles per block, clusters of 2 to 16
// blocks, shared experts, biases, input scaling, both dtypes, K shorter than four chunks (empty
// parts) and local experts (slots of other shards skipped; a token with none writes zeros).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

// Decode forced, tiles per block `tiles` (0: the launcher's), FC2 with the combine on calls of up
// to `combine` tokens.
PrepareOptions combine_options(int combine, int tiles = 1) {
  PrepareOptions o = with_tiles(tiles, with_dispatch("decode/1"));
  o.decode.combine = combine;
  return o;
}

// Whether a call of ti on tl (prepared with o) ran without a finalize kernel: its profile says
// the combine was done in FC2.
bool ran_combined(const TestLayer& tl, const TestInputs& ti, const PrepareOptions& o) {
  std::unique_ptr<PreparedLayer> layer;
  if (!prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, o, &layer).is_ok()) return false;
  DeviceInputs d;
  if (!stage_inputs(ti, &d)) return false;
  const int64_t t = tokens_of(ti.in);
  GpuBuffer ws, out;
  if (!ws.allocate(layer->workspace_size(t)) ||
      !out.allocate(static_cast<size_t>(t * tl.spec.hidden) * dtype_size(tl.spec.act_dtype))) {
    return false;
  }
  MutableTensorView ov(out.get(), tl.spec.act_dtype, {t, tl.spec.hidden});
  RunProfile p;
  if (!layer->run(d.in, ov, ws.get(), ws.bytes(), nullptr, &p).is_ok()) return false;
  return p.combine_fused;
}

// On a fresh layer of spec s: at 1, 2 and 3 tokens and 1, 2, 4 and 16 tiles per block (and the
// launcher's choice at one token) the combine's output equals FC2 with the same tiles and the
// finalize kernel bit for bit, both within the budget; the combine really ran.
void check_combine(const LayerSpec& s, bool router_weights = false) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(layer_name(s) + " " + dtype_name(s.act_dtype) + " seed " + std::to_string(seed));
  TestLayer tl;
  make_layer(s, seed, &tl);
  for (int64_t tokens : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(tokens) + " tokens");
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, router_weights, &ti);
    for (int tiles : {0, 1, 2, 4, 16}) {
      if (tiles == 0 && tokens > 1) continue;  // the launcher's choice may differ from FC2's
      SCOPED_TRACE(std::to_string(tiles) + " tiles per block");
      GpuRun with, without;
      gpu_run(tl, ti, &with, combine_options(3, tiles));
      gpu_run(tl, ti, &without, combine_options(0, tiles));
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_LE(with.error, gpu_budget(s.act_dtype));
      EXPECT_LE(without.error, gpu_budget(s.act_dtype));
      EXPECT_EQ(with.out, without.out);
    }
    EXPECT_TRUE(ran_combined(tl, ti, combine_options(3)));
    EXPECT_FALSE(ran_combined(tl, ti, combine_options(0)));
  }
}

TEST(GpuDecodeCombine, IntegerCodesKeepTheFinalizeBits) {
  QMOE_REQUIRE_GPU();
  // FC2's scale blocks inside a chunk (16, 32), spanning chunks, per channel.
  for (const IntCase& c : {IntCase{WeightFormat::kInt4, 128, false, DType::kBF16},
                           IntCase{WeightFormat::kInt4, 16, true, DType::kF16},
                           IntCase{WeightFormat::kInt2, 32, true, DType::kBF16},
                           IntCase{WeightFormat::kInt3, 64, false, DType::kF16},
                           IntCase{WeightFormat::kInt8, 0, true, DType::kBF16}}) {
    check_combine(int_case_spec(c, 512, 768, 16, 4));
  }
}

TEST(GpuDecodeCombine, FloatCodesKeepTheFinalizeBits) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat f :
       {WeightFormat::kNvFp4, WeightFormat::kMxFp4, WeightFormat::kFp8, WeightFormat::kFp8Block}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      // FC2's K of 320: fp8_block's last block of 128 is short (64).
      LayerSpec s = small_spec(f, 512, 320, 16, 4);
      s.act_dtype = dt;
      if (f == WeightFormat::kFp8) s.fc1.scale_dtype = s.fc2.scale_dtype = DType::kF32;
      check_combine(s);
    }
  }
}

// Shared experts (more slots than top_k: clusters of 16, past the portable 8), FC2 biases, routing
// weights, input scaling without w_j, a long K, and K of one chunk (three of the four warps'
// parts empty).
TEST(GpuDecodeCombine, SlotsBiasesAndShortK) {
  QMOE_REQUIRE_GPU();
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 32, 12);
    s.routing.num_shared = 4;
    s.has_fc1_bias = s.has_fc2_bias = true;
    s.act_dtype = DType::kBF16;
    check_combine(s, /*router_weights=*/true);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 9, 1);
    s.routing.method = RoutingMethod::kTopKSigmoid;
    s.routing.combine = CombineMode::kScaleInput;
    s.routing.num_shared = 1;
    s.routing.shared_weight = SharedWeight::kOne;
    s.has_fc2_bias = true;
    s.act_dtype = DType::kF16;
    check_combine(s);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 4096, 16, 16);  // 16 slots, K 4096
    s.act_dtype = DType::kF16;
    check_combine(s);
  }
  {
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 64, 8, 2);  // FC2's K: one chunk
    s.fc1.block_size = s.fc2.block_size = 64;
    s.act_dtype = DType::kBF16;
    check_combine(s);
  }
}

// More slots than the combine takes (a cluster holds at most 16 blocks), or an FC2 whose block
// of one tile leaves room for fewer than two per multiprocessor (a K of 49152: a cluster's blocks
// must all fit one GPC): the layer keeps FC2 and the finalize kernel, within the budget.
TEST(GpuDecodeCombine, LayersItDoesNotTakeKeepTheFinalize) {
  QMOE_REQUIRE_GPU();
  struct Case {
    int64_t h, i, e;
    int k;
  };
  for (const Case& c : {Case{256, 128, 32, 17}, Case{128, 49152, 4, 2}}) {
    LayerSpec s = small_spec(WeightFormat::kInt4, c.h, c.i, c.e, c.k);
    s.act_dtype = DType::kBF16;
    SCOPED_TRACE("I " + std::to_string(c.i) + ", k " + std::to_string(c.k));
    const uint64_t seed = fresh_seed();
    TestLayer tl;
    make_layer(s, seed, &tl);
    TestInputs ti;
    make_inputs(tl.spec, 1, seed, false, &ti);
    EXPECT_FALSE(ran_combined(tl, ti, combine_options(3)));
    GpuRun r;
    gpu_run(tl, ti, &r, combine_options(3));
    EXPECT_LE(r.error, gpu_budget(s.act_dtype));
  }
}

// Local experts: a shard's FC2 with the combine skips the slots of other shards' experts; with
// every route sent to the first shard, the second writes exact zeros. Both equal FC2 with the
// finalize kernel bit for bit.
TEST(GpuDecodeCombine, ShardsSkipOtherExperts) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt4, 512, 256, 16, 4);
  s.act_dtype = DType::kBF16;
  s.has_fc2_bias = true;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TestLayer whole;
  make_layer(s, seed, &whole);
  for (int64_t tokens : {1, 3}) {
    TestInputs ti;
    make_inputs(whole.spec, tokens, seed + tokens, false, &ti);
    for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 6}, {6, 10}}) {
      const TestLayer shard = make_shard(whole, first, count);
      GpuRun with, without;
      gpu_run(shard, ti, &with, combine_options(3));
      gpu_run(shard, ti, &without, combine_options(0));
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_LE(with.error, gpu_budget(s.act_dtype)) << "shard at " << first;
      EXPECT_EQ(with.out, without.out) << "shard at " << first;
      EXPECT_TRUE(ran_combined(shard, ti, combine_options(3)));
    }
    // Every route to experts 0..3 (logits far above the rest): the shard [6, 16) holds none.
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < 4; ++e) {
        store_float(ti.logits.data(), s.act_dtype, t * s.num_experts + e,
                    50.0f - static_cast<float>(e));
      }
    }
    GpuRun none;
    gpu_run(make_shard(whole, 6, 10), ti, &none, combine_options(3), 0xFF, false);
    for (double v : none.out_f64) ASSERT_EQ(v, 0.0);
  }
}

}  // namespace
}  // namespace qmoe::test

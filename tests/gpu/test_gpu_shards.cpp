// Local experts on the CUDA backend (LayerSpec::first_expert, local_experts): a shard holds
// experts [first, first + L) of E, routes over all E and returns its partial sum. R shards run in
// turn on one device: each shard against the oracle's and the CPU backend's partial for that
// shard, the shards' sum against the whole layer (oracle and CUDA), on every dispatch path the
// layer offers (generic with each GEMM, decode forms, fused); a shard its tokens never route to
// writes exact zeros; graph replays equal eager calls bit for bit; the fused kernel's grid size
// and the decode kernels' tiles per block and weight rings change no bit.
//
// Every shard's weights are views into one whole layer's tensors (make_shard, layer_factory.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

// The CPU backend's output for ti on tl, as doubles.
void cpu_run(const TestLayer& tl, const TestInputs& ti, std::vector<double>* out) {
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, {}, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const int64_t t = tokens_of(ti.in);
  const DType dt = tl.spec.act_dtype;
  std::vector<uint8_t> bytes(static_cast<size_t>(t * tl.spec.hidden) * dtype_size(dt));
  st = run_layer(*layer, ti.in, MutableTensorView(bytes.data(), dt, {t, tl.spec.hidden}));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  out->resize(static_cast<size_t>(t * tl.spec.hidden));
  for (size_t i = 0; i < out->size(); ++i) {
    (*out)[i] = load_float(bytes.data(), dt, static_cast<int64_t>(i));
  }
}

// Prepares tl on the GPU with `opt` and checks that a call of `tokens` takes `choice` (where one
// is given).
void prepare_gpu(const TestLayer& tl, const PrepareOptions& opt, int64_t tokens,
                 const std::string& choice, std::unique_ptr<PreparedLayer>* layer) {
  const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, opt, layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  if (!choice.empty()) ASSERT_EQ((*layer)->dispatch_choice(tokens), choice);
}

// The whole layer and its shards [bounds[r], bounds[r + 1]) on the GPU with `opt` (its dispatch,
// if any, checked to be taken): each shard within the budget of its oracle partial and of the CPU
// backend's (a quarter more); the shards' sum within the budget of the whole layer's oracle output
// and twice it of the whole layer's CUDA output. With 8 or more tokens (and `spread`, random
// routing) at least two shards must get routes, so the sum is no single shard's output.
void check_shards(const TestLayer& whole, const TestInputs& ti, const std::vector<int64_t>& bounds,
                  const PrepareOptions& opt, bool spread = true) {
  const int64_t tokens = tokens_of(ti.in);
  const double budget = gpu_budget(whole.spec.act_dtype);
  SCOPED_TRACE(layer_name(whole.spec) + ", " + std::to_string(tokens) + " tokens, dispatch '" +
               opt.dispatch + "', gemm '" + opt.gemm + "'");
  std::unique_ptr<PreparedLayer> layer;
  prepare_gpu(whole, opt, tokens, opt.dispatch, &layer);
  if (::testing::Test::HasFatalFailure()) return;
  GpuRun whole_gpu;
  gpu_run(whole, ti, &whole_gpu, {}, 0xFF, false, layer.get());
  if (::testing::Test::HasFatalFailure()) return;
  std::vector<double> whole_ref;
  Status st = reference_forward(whole.spec, whole.weights, ti.in, &whole_ref);
  ASSERT_TRUE(st.is_ok()) << st.to_string();

  std::vector<double> sum(whole_ref.size(), 0.0);
  int shards_with_routes = 0;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) {
    SCOPED_TRACE("shard [" + std::to_string(bounds[r]) + ", " + std::to_string(bounds[r + 1]) +
                 ")");
    const TestLayer sh = make_shard(whole, bounds[r], bounds[r + 1] - bounds[r]);
    prepare_gpu(sh, opt, tokens, opt.dispatch, &layer);
    if (::testing::Test::HasFatalFailure()) return;
    GpuRun part;
    gpu_run(sh, ti, &part, {}, 0xFF, true, layer.get());
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_LE(part.error, budget) << "against the oracle's partial";
    std::vector<double> cpu;
    cpu_run(sh, ti, &cpu);
    if (::testing::Test::HasFatalFailure()) return;
    // The CPU backend's partial is itself off the oracle by its output's rounding (u / sqrt(3)
    // RMS, about a ninth of the bf16 and f16 budgets): a quarter more covers it.
    EXPECT_LE(relative_norm_error(part.out_f64.data(), cpu.data(), cpu.size()), 1.25 * budget)
        << "against the CPU backend's partial";
    bool any = false;
    for (size_t i = 0; i < sum.size(); ++i) {
      sum[i] += part.out_f64[i];
      any = any || part.out_f64[i] != 0.0;
    }
    shards_with_routes += any;
  }
  if (spread && tokens >= 8) EXPECT_GE(shards_with_routes, 2);
  EXPECT_LE(relative_norm_error(sum.data(), whole_ref.data(), sum.size()), budget)
      << "the shards' sum against the whole layer's oracle output";
  EXPECT_LE(relative_norm_error(sum.data(), whole_gpu.out_f64.data(), sum.size()), 2 * budget)
      << "the shards' sum against the whole layer on the GPU";
}

// check_shards() for every dispatch choice the whole layer offers at each token count (the
// shards offer the same: decode and fused support depend on the shapes and formats only).
void check_every_path(const TestLayer& whole, const std::vector<int64_t>& bounds,
                      const std::vector<int64_t>& token_counts, uint64_t seed,
                      bool router_weights = false) {
  std::unique_ptr<PreparedLayer> layer;
  prepare_gpu(whole, {}, 0, "", &layer);
  if (::testing::Test::HasFatalFailure()) return;
  for (int64_t tokens : token_counts) {
    TestInputs ti;
    make_inputs(whole.spec, tokens, seed + static_cast<uint64_t>(tokens), router_weights, &ti);
    for (const std::string& choice : layer->dispatch_candidates(tokens)) {
      check_shards(whole, ti, bounds, with_dispatch(choice));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// A random bf16/f16 layer of `spec` from a fresh seed (into a fresh TestLayer: make_layer keeps
// bias buffers a spec without biases leaves alone).
void make_whole(LayerSpec spec, DType dt, TestLayer* tl, uint64_t* seed) {
  *tl = TestLayer{};
  spec.act_dtype = dt;
  *seed = fresh_seed();
  make_layer(spec, *seed, tl);
}

TEST(GpuShards, IntegerShardsOnEveryPath) {
  QMOE_REQUIRE_GPU();
  // int4 with zero points (the decode kernel's and the fused kernel's zero points) and int8, with
  // FC1 and FC2 biases (indexed by local expert), two and three (uneven) shards.
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kInt8}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      LayerSpec s = small_spec(f, 256, 128, 16, 4);
      s.has_fc1_bias = s.has_fc2_bias = true;
      if (f == WeightFormat::kInt4) {
        s.fc1.zero_points = s.fc2.zero_points = true;
        s.fc1.block_size = s.fc2.block_size = 32;
      }
      TestLayer whole;
      uint64_t seed = 0;
      make_whole(s, dt, &whole, &seed);
      SCOPED_TRACE("seed " + std::to_string(seed));
      check_every_path(whole, {0, 8, 16}, {1, 7, 12, 40, 200}, seed);
      check_every_path(whole, {0, 5, 11, 16}, {3, 16, 96}, seed + 1);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(GpuShards, FloatFormatsOnEveryPath) {
  QMOE_REQUIRE_GPU();
  const std::pair<WeightFormat, DType> cases[] = {{WeightFormat::kNvFp4, DType::kBF16},
                                                  {WeightFormat::kMxFp4, DType::kF16},
                                                  {WeightFormat::kFp8Block, DType::kBF16},
                                                  {WeightFormat::kFp8, DType::kF16}};
  for (const auto& [f, dt] : cases) {
    TestLayer whole;
    uint64_t seed = 0;
    make_whole(small_spec(f, 256, 128, 16, 4), dt, &whole, &seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    check_every_path(whole, {0, 6, 16}, {2, 40}, seed);
    check_every_path(whole, {0, 3, 9, 16}, {24}, seed + 1);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(GpuShards, GenericPathGemms) {
  QMOE_REQUIRE_GPU();
  // Symmetric int4 in bf16: the mixed-input GEMM (cutlass), dequantize + CUTLASS, dequantize +
  // mma; then an fp32 layer (the fp32 grouped GEMM), and a small dequantize scratch that takes
  // several waves.
  TestLayer whole;
  uint64_t seed = 0;
  make_whole(small_spec(WeightFormat::kInt4, 256, 128, 16, 4), DType::kBF16, &whole, &seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  TestInputs ti;
  make_inputs(whole.spec, 150, seed, false, &ti);
  for (const char* gemm : {"cutlass", "cutlass-dequant", "mma"}) {
    check_shards(whole, ti, {0, 7, 16}, with_gemm(gemm, with_dispatch("generic")));
  }
  PrepareOptions waves = with_gemm("cutlass-dequant", with_dispatch("generic"));
  waves.max_dequant_bytes = 3 * 256 * 256 * 2;  // three experts' FC1 per wave
  check_shards(whole, ti, {0, 4, 10, 16}, waves);

  LayerSpec s = small_spec(WeightFormat::kInt8, 64, 32, 12, 3);
  s.fc1.block_size = s.fc2.block_size = 32;  // a block must divide K (32 and 64)
  s.has_fc2_bias = true;
  TestLayer f32;
  make_layer(s, seed + 1, &f32);
  make_inputs(s, 50, seed + 1, false, &ti);
  check_shards(f32, ti, {0, 4, 12}, with_dispatch("generic"));
}

TEST(GpuShards, SharedExperts) {
  QMOE_REQUIRE_GPU();
  // The last two of 16 experts are shared (14 and 15): each of the last two shards holds one, the
  // first none. Every token routes to both, so those shards run every token.
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.routing.num_shared = 2;
  s.has_fc2_bias = true;
  TestLayer whole;
  uint64_t seed = 0;
  make_whole(s, DType::kBF16, &whole, &seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  check_every_path(whole, {0, 8, 15, 16}, {1, 9, 64}, seed);

  // FP8 with a separate FC3 (the decode path packs FC1 and FC3 as one).
  LayerSpec g = small_spec(WeightFormat::kFp8Block, 256, 128, 16, 2);
  g.routing.num_shared = 1;
  g.activation.glu = GluLayout::kSeparateFc3;
  make_whole(g, DType::kBF16, &whole, &seed);
  SCOPED_TRACE("fc3 seed " + std::to_string(seed));
  check_every_path(whole, {0, 10, 16}, {5, 40}, seed);
}

TEST(GpuShards, RoutingMethods) {
  QMOE_REQUIRE_GPU();
  // DeepSeek's grouped top-k (router bias over all E), given router weights, and Llama-4's
  // top-k sigmoid scaling the input.
  LayerSpec g = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  g.routing.method = RoutingMethod::kGroupedTopK;
  g.routing.n_group = 4;
  g.routing.topk_group = 2;
  g.routing.routed_scaling_factor = 2.5f;
  TestLayer whole;
  uint64_t seed = 0;
  make_whole(g, DType::kBF16, &whole, &seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  check_every_path(whole, {0, 4, 8, 12, 16}, {6, 48}, seed);

  LayerSpec w = small_spec(WeightFormat::kInt8, 256, 128, 16, 4);
  make_whole(w, DType::kF16, &whole, &seed);
  check_every_path(whole, {0, 9, 16}, {10}, seed, /*router_weights=*/true);

  LayerSpec l = small_spec(WeightFormat::kInt4, 256, 128, 16, 1);
  l.routing.method = RoutingMethod::kTopKSigmoid;
  l.routing.normalize = false;
  l.routing.combine = CombineMode::kScaleInput;
  make_whole(l, DType::kBF16, &whole, &seed);
  check_every_path(whole, {0, 6, 16}, {24, 70}, seed);
}

// Logits that send every token to experts 0 .. top_k - 1 only (far above the rest, distinct).
void route_to_first_experts(const LayerSpec& s, TestInputs* ti) {
  const int64_t tokens = tokens_of(ti->in);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < s.num_experts; ++e) {
      const float v = e < s.routing.top_k ? 8.0f - 0.25f * static_cast<float>(e) : -8.0f;
      store_float(ti->logits.data(), s.act_dtype, t * s.num_experts + e, v);
    }
  }
}

TEST(GpuShards, ShardWithoutRoutesWritesZeros) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.has_fc1_bias = s.has_fc2_bias = true;  // a bias must not leak into a shard without routes
  TestLayer whole;
  uint64_t seed = 0;
  make_whole(s, DType::kBF16, &whole, &seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::unique_ptr<PreparedLayer> layer;
  prepare_gpu(whole, {}, 0, "", &layer);
  if (::testing::Test::HasFatalFailure()) return;
  const TestLayer idle = make_shard(whole, 8, 8);
  for (int64_t tokens : {1, 5, 16, 100}) {
    TestInputs ti;
    make_inputs(whole.spec, tokens, seed + static_cast<uint64_t>(tokens), false, &ti);
    route_to_first_experts(whole.spec, &ti);
    for (const std::string& choice : layer->dispatch_candidates(tokens)) {
      SCOPED_TRACE(choice + ", " + std::to_string(tokens) + " tokens");
      std::unique_ptr<PreparedLayer> shard;
      prepare_gpu(idle, with_dispatch(choice), tokens, choice, &shard);
      if (::testing::Test::HasFatalFailure()) return;
      GpuRun r;
      gpu_run(idle, ti, &r, {}, 0xFF, true, shard.get());  // the workspace and output poisoned
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_EQ(r.out, std::vector<uint8_t>(r.out.size(), 0)) << "expected +0 everywhere";
      EXPECT_EQ(r.error, 0.0);
      // The shard holding experts 0..7 has every route: it is the whole layer, within budget.
      check_shards(whole, ti, {0, 8, 16}, with_dispatch(choice), /*spread=*/false);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(GpuShards, GraphReplayEqualsEagerBitwise) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.routing.num_shared = 1;
  TestLayer whole;
  uint64_t seed = 0;
  make_whole(s, DType::kBF16, &whole, &seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer sh = make_shard(whole, 5, 11);  // holds the shared expert 15
  for (const char* choice : {"generic", "decode/1", "fused"}) {
    for (int64_t tokens : {1, 11, 80}) {
      SCOPED_TRACE(std::string(choice) + ", " + std::to_string(tokens) + " tokens");
      std::unique_ptr<PreparedLayer> layer;
      const Status st =
          prepare_layer(BackendKind::kCuda, sh.spec, sh.weights, with_dispatch(choice), &layer);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      check_graph_replay(sh, layer.get(), tokens, seed + static_cast<uint64_t>(tokens), 2);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(GpuShards, DecodeTilesAndRings) {
  QMOE_REQUIRE_GPU();
  // On a shard, the decode kernel within budget, and tiles per block and both weight rings the
  // same bits (the decode kernels' scheduling changes no bit).
  for (WeightFormat f : {WeightFormat::kInt4, WeightFormat::kNvFp4}) {
    TestLayer whole;
    uint64_t seed = 0;
    make_whole(small_spec(f, 256, 128, 16, 4), DType::kBF16, &whole, &seed);
    SCOPED_TRACE(layer_name(whole.spec));
    check_decode_tiles_and_rings(make_shard(whole, 4, 9), seed);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(GpuShards, FusedGridSizeChangesNoBit) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.has_fc2_bias = true;
  TestLayer whole;
  uint64_t seed = 0;
  make_whole(s, DType::kBF16, &whole, &seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const TestLayer sh = make_shard(whole, 3, 6);
  for (int64_t tokens : {2, 13}) {
    TestInputs ti;
    make_inputs(whole.spec, tokens, seed + static_cast<uint64_t>(tokens), false, &ti);
    std::vector<uint8_t> first;
    for (int grid : {0, 1, 3, 7}) {
      PrepareOptions o = with_dispatch("fused");
      o.fused_grid_ctas = grid;
      std::unique_ptr<PreparedLayer> layer;
      prepare_gpu(sh, o, tokens, "fused", &layer);
      if (::testing::Test::HasFatalFailure()) return;
      GpuRun r;
      gpu_run(sh, ti, &r, {}, 0xFF, true, layer.get());
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_LE(r.error, gpu_budget(whole.spec.act_dtype)) << grid << " CTAs";
      if (first.empty()) first = r.out;
      EXPECT_EQ(r.out, first) << grid << " CTAs, " << tokens << " tokens";
    }
  }
}

}  // namespace
}  // namespace qmoe::test

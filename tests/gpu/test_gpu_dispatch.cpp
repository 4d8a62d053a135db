// The CUDA backend's dispatch table (src/cuda/layer/dispatch.h): the analytic default, tuned rows,
// the QMOE_DISPATCH override and its errors; then, on a GPU, every choice against the oracle, the
// decode kernel's column-group variants bit for bit against each other, and a tune file applied
// through PrepareOptions.
#include <gtest/gtest.h>

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

std::string chosen(const DispatchTable& t, int64_t tokens) {
  DispatchChoice c;
  const Status s = t.choose(tokens, &c);
  return s.is_ok() ? choice_name(c) : "error: " + s.message();
}

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
  const DispatchTable no_dequant(true, 8, 128, true);  // the generic path reads the codes
  EXPECT_EQ(chosen(no_dequant, 128), "decode/1");      // 8 routes per expert
  EXPECT_EQ(chosen(no_dequant, 129), "generic");
  EXPECT_EQ(chosen(no_dequant, 64), "decode/1");  // the 64-token window stays
  const DispatchTable wide(true, 8, 1 << 14);     // the window never passes the kernel's bound
  EXPECT_EQ(chosen(wide, cuda::kDecodeMaxRoutes), "decode/1");
  EXPECT_EQ(chosen(wide, cuda::kDecodeMaxRoutes + 1), "generic");
  const DispatchTable none(false, 8, 128);
  EXPECT_EQ(chosen(none, 1), "generic");
}

TEST(Dispatch, TunedRowsReplaceTheDefaultUpToTheirLastRow) {
  DispatchTable t(true, 8, 128);
  ASSERT_TRUE(t.apply_tuned({{2, "decode/2"}, {16, "generic"}, {100, "decode/1"}}).is_ok());
  EXPECT_EQ(chosen(t, 1), "decode/2");
  EXPECT_EQ(chosen(t, 3), "generic");
  EXPECT_EQ(chosen(t, 16), "generic");
  EXPECT_EQ(chosen(t, 17), "decode/1");
  EXPECT_EQ(chosen(t, 101), "decode/1");  // past the rows: the analytic default
  EXPECT_EQ(chosen(t, 300), "generic");
  ASSERT_TRUE(t.apply_tuned({{cuda::kDecodeMaxRoutes + 10, "decode/2"}}).is_ok());
  EXPECT_EQ(chosen(t, cuda::kDecodeMaxRoutes), "decode/2");
  EXPECT_EQ(chosen(t, cuda::kDecodeMaxRoutes + 1), "generic");  // past the decode kernel's bound
  const Status bad = t.apply_tuned({{4, "decode/3"}});
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("decode/3"), std::string::npos);
  EXPECT_FALSE(t.apply_tuned({{4, "generic"}, {4, "generic"}}).is_ok());
}

TEST(Dispatch, EnvironmentOverride) {
  const DispatchTable t(true, 8, 128);
  {
    EnvOverride o("QMOE_DISPATCH", "decode/2");
    EXPECT_EQ(chosen(t, 1), "decode/2");
    EXPECT_EQ(chosen(t, 1000), "decode/2");
    EXPECT_EQ(chosen(t, cuda::kDecodeMaxRoutes + 1), "generic");
  }
  {
    EnvOverride o("QMOE_CUDA_PATH", "generic");
    EXPECT_EQ(chosen(t, 1), "generic");
  }
  {
    EnvOverride o("QMOE_DISPATCH", "fast");
    const std::string r = chosen(t, 1);
    EXPECT_NE(r.find("QMOE_DISPATCH"), std::string::npos) << r;
    EXPECT_NE(r.find("fast"), std::string::npos) << r;
  }
  EXPECT_EQ(cuda::dispatch_candidates(true, 4).size(), 3u);   // generic, decode/1, decode/cc
  EXPECT_EQ(cuda::dispatch_candidates(true, 12).size(), 3u);  // generic, decode/1, decode/2
  EXPECT_EQ(cuda::dispatch_candidates(false, 12).size(), 1u);
  EXPECT_EQ(cuda::dispatch_candidates(true, cuda::kDecodeMaxRoutes).size(), 3u);
  EXPECT_EQ(cuda::dispatch_candidates(true, cuda::kDecodeMaxRoutes + 1).size(), 1u);
}

// The fused kernel: a candidate up to the layer's bound, never where the layer lacks it; forced
// past the bound (or on a layer without it), the decode kernel or the generic path.
TEST(Dispatch, FusedChoice) {
  const DispatchTable t(true, 8, 128, false, 16);
  const auto names = [](const std::vector<DispatchChoice>& v) {
    std::string s;
    for (const DispatchChoice& c : v) s += choice_name(c) + " ";
    return s;
  };
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 1, 16)), "generic decode/1 decode/cc fused ");
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 16, 16)), "generic decode/1 decode/2 fused ");
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 17, 16)), "generic decode/1 decode/2 ");
  EXPECT_EQ(names(cuda::dispatch_candidates(true, 4, 0)), "generic decode/1 decode/cc ");
  DispatchChoice c;
  ASSERT_TRUE(cuda::parse_choice("fused", &c));
  EXPECT_EQ(c.path, CallPath::kFused);
  {
    EnvOverride o("QMOE_DISPATCH", "fused");
    EXPECT_EQ(chosen(t, 1), "fused");
    EXPECT_EQ(chosen(t, 16), "fused");
    EXPECT_EQ(chosen(t, 17), "decode/1");
    EXPECT_EQ(chosen(DispatchTable(true, 8, 128), 1), "decode/1");
    EXPECT_EQ(chosen(DispatchTable(false, 8, 128), 1), "generic");
  }
  DispatchTable tuned(true, 8, 128, false, 16);
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

// Every choice within budget; decode/1 and decode/2 compute each route's column alike, so they
// agree bit for bit (decode/1 runs more passes past 8 routes). decode/cc (CUDA cores, a pass per
// route) sums in another order: within budget only.
TEST(GpuDispatch, EveryChoiceMatchesOracleAndGroupsAgreeBitwise) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 8, 8);  // every token on every expert
  s.act_dtype = DType::kBF16;
  TestLayer tl;
  make_layer(s, seed, &tl);
  for (int64_t tokens : {1, 8, 12, 40}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    GpuRun runs[4];
    const char* names[4] = {"generic", "decode/1", "decode/2", "decode/cc"};
    for (int i = 0; i < 4; ++i) {
      gpu_run_with("QMOE_DISPATCH", names[i], tl, ti, &runs[i]);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_LE(runs[i].error, gpu_budget(s.act_dtype)) << names[i] << ", " << tokens << " tokens";
    }
    EXPECT_EQ(runs[1].out, runs[2].out) << tokens << " tokens";
  }
}

// Past the analytic default's window the decode kernel still takes a call when a tune file or the
// override asks for it: experts with many more routes than a pass holds (16) run several passes.
// 8 experts of 8 routes per token: every expert takes every token.
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
    {
      EnvOverride o("QMOE_DISPATCH", "decode/1");
      EXPECT_EQ(layer->dispatch_choice(tokens), "decode/1") << tokens << " tokens";
    }
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    GpuRun one, two;
    gpu_run_with("QMOE_DISPATCH", "decode/1", tl, ti, &one);
    if (::testing::Test::HasFatalFailure()) return;
    gpu_run_with("QMOE_DISPATCH", "decode/2", tl, ti, &two);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_LE(one.error, gpu_budget(s.act_dtype)) << tokens << " tokens";
    EXPECT_LE(two.error, gpu_budget(s.act_dtype)) << tokens << " tokens";
    EXPECT_EQ(one.out, two.out) << tokens << " tokens";
  }
}

TEST(GpuDispatch, BadOverrideLaunchesNothing) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt4);
  s.act_dtype = DType::kBF16;
  TestLayer tl;
  make_layer(s, fresh_seed(), &tl);
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer).is_ok());
  TestInputs ti;
  make_inputs(tl.spec, 2, fresh_seed(), false, &ti);
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(ti, &d));
  GpuBuffer ws, out;
  const size_t bytes = layer->workspace_size(2);
  ASSERT_TRUE(ws.allocate(bytes, 0xFF, 1024));
  ASSERT_TRUE(out.allocate(2 * tl.spec.hidden * 2, 0x7E, 256));
  MutableTensorView ov(out.get(), tl.spec.act_dtype, {2, tl.spec.hidden});
  EnvOverride o("QMOE_DISPATCH", "decode/9");
  const Status st = layer->run(d.in, ov, ws.get(), bytes, nullptr);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("QMOE_DISPATCH"), std::string::npos) << st.message();
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint8_t> host;
  ASSERT_TRUE(out.download(&host));
  for (uint8_t b : host) ASSERT_EQ(b, 0x7E) << "output written despite the error";
}

// A small int4 bf16 layer, a fresh temporary tune-file path, and the tune key of the layer on
// device 0.
struct TuneFixture {
  TestLayer tl;
  std::string path;
  std::string key;
};
void tune_fixture(TuneFixture* f) {
  LayerSpec s = small_spec(WeightFormat::kInt4);
  s.act_dtype = DType::kBF16;
  make_layer(s, fresh_seed(), &f->tl);
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
  EXPECT_EQ(layer->dispatch_candidates(12).size(), 4u);  // generic, decode/1, decode/2, fused
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

// The CUDA backend's call contract: CUDA-graph replay equals eager runs bit for bit, two layers on
// two streams run concurrently and correctly, bad calls get a clear status and launch nothing,
// non-finite inputs are reported (deferred) and poison only their own tokens, the workspace
// formula, and per-stage profiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "gpu_layer_harness.h"
#include "qmoe/routing.h"

namespace qmoe::test {
namespace {

struct Prepared {
  TestLayer tl;
  std::unique_ptr<PreparedLayer> layer;
};

void prepare(const LayerSpec& s, uint64_t seed, Prepared* p, const PrepareOptions& opt = {}) {
  make_layer(s, seed, &p->tl);
  Status st = prepare_layer(BackendKind::kCuda, p->tl.spec, p->tl.weights, opt, &p->layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
}

// Eager run of `ti` on `layer` into host bytes, through the harness (poisoned workspace).
void eager(Prepared& p, const TestInputs& ti, std::vector<uint8_t>* out) {
  GpuRun r;
  gpu_run(p.tl, ti, &r, {}, 0xFF, false, p.layer.get());
  *out = r.out;
}

TEST(GpuContract, GraphReplayEqualsEager) {
  QMOE_REQUIRE_GPU();
  for (int64_t tokens : {4, 300}) {  // the fused and the general routing path
    const uint64_t seed = fresh_seed();
    Prepared p;
    LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
    s.act_dtype = DType::kBF16;
    prepare(s, seed, &p);
    check_graph_replay(p.tl, p.layer.get(), tokens, seed, 3);
  }
}

TEST(GpuContract, TwoLayersOnTwoStreams) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Prepared a, b;
  LayerSpec sa = small_spec(WeightFormat::kInt4, 512, 256, 32, 4);
  sa.act_dtype = DType::kBF16;
  LayerSpec sb = small_spec(WeightFormat::kMxFp4, 256, 256, 16, 2);
  sb.act_dtype = DType::kF16;
  prepare(sa, seed, &a);
  prepare(sb, seed + 1, &b);
  const int64_t ta = 700, tb = 33;
  TestInputs ia, ib;
  make_inputs(a.tl.spec, ta, seed, false, &ia);
  make_inputs(b.tl.spec, tb, seed + 1, false, &ib);
  std::vector<uint8_t> want_a, want_b;
  eager(a, ia, &want_a);
  eager(b, ib, &want_b);

  DeviceInputs da, db;
  ASSERT_TRUE(stage_inputs(ia, &da));
  ASSERT_TRUE(stage_inputs(ib, &db));
  GpuBuffer wsa, wsb, oa, ob;
  ASSERT_TRUE(wsa.allocate(a.layer->workspace_size(ta)));
  ASSERT_TRUE(wsb.allocate(b.layer->workspace_size(tb)));
  ASSERT_TRUE(oa.allocate(static_cast<size_t>(ta * sa.hidden) * 2));
  ASSERT_TRUE(ob.allocate(static_cast<size_t>(tb * sb.hidden) * 2));
  cudaStream_t s1, s2;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_ASSERT(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  for (int i = 0; i < 5; ++i) {  // interleaved submissions
    MutableTensorView va(oa.get(), sa.act_dtype, {ta, sa.hidden});
    MutableTensorView vb(ob.get(), sb.act_dtype, {tb, sb.hidden});
    ASSERT_TRUE(a.layer->run(da.in, va, wsa.get(), wsa.bytes(), s1).is_ok());
    ASSERT_TRUE(b.layer->run(db.in, vb, wsb.get(), wsb.bytes(), s2).is_ok());
  }
  CUDA_ASSERT(cudaStreamSynchronize(s1));
  CUDA_ASSERT(cudaStreamSynchronize(s2));
  std::vector<uint8_t> got_a, got_b;
  ASSERT_TRUE(oa.download(&got_a));
  ASSERT_TRUE(ob.download(&got_b));
  EXPECT_EQ(got_a, want_a);
  EXPECT_EQ(got_b, want_b);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

TEST(GpuContract, BadCallsAreRejectedWithoutLaunching) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Prepared p;
  LayerSpec s = small_spec(WeightFormat::kInt4);
  s.act_dtype = DType::kBF16;
  prepare(s, seed, &p);
  const int64_t t = 4;
  TestInputs ti;
  make_inputs(p.tl.spec, t, seed, false, &ti);
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(ti, &d));
  const size_t bytes = p.layer->workspace_size(t);
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(bytes + 512));
  const size_t out_bytes = static_cast<size_t>(t * s.hidden) * 2;
  ASSERT_TRUE(out.allocate(out_bytes + 2));
  MutableTensorView ov(out.get(), s.act_dtype, {t, s.hidden});
  auto expect_error = [&](const Status& st, const std::string& what) {
    EXPECT_FALSE(st.is_ok()) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };

  // Workspace: too small (one byte short, or planned for fewer tokens), null, misaligned.
  expect_error(p.layer->run(d.in, ov, ws.get(), bytes - 1, nullptr),
               "workspace: expected at least " + std::to_string(bytes));
  expect_error(p.layer->run(d.in, ov, ws.get(), p.layer->workspace_size(t - 1), nullptr),
               "workspace: expected at least");
  expect_error(p.layer->run(d.in, ov, nullptr, bytes, nullptr), "workspace: expected at least");
  expect_error(p.layer->run(d.in, ov, ws.as<char>() + 64, bytes, nullptr),
               "workspace: expected a 256-byte aligned pointer");
  // Misaligned and host pointers.
  MutableTensorView odd(out.as<char>() + 1, s.act_dtype, {t, s.hidden});
  expect_error(p.layer->run(d.in, odd, ws.get(), bytes, nullptr),
               "output: expected a 2-byte aligned pointer");
  RunInputs host = d.in;
  host.input.data = ti.x.data();
  expect_error(p.layer->run(host, ov, ws.get(), bytes, nullptr), "input: expected device memory");
  RunInputs null_logits = d.in;
  null_logits.router_logits.data = nullptr;
  expect_error(p.layer->run(null_logits, ov, ws.get(), bytes, nullptr), "router_probs");
  // Nothing above may have launched: the output is still poison.
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<uint16_t> o;
  ASSERT_TRUE(out.download(&o));
  for (size_t i = 0; i < static_cast<size_t>(t * s.hidden); ++i) {
    ASSERT_EQ(o[i], 0xFFFF) << "element " << i << " written by a rejected call";
  }
  // A profile while capturing is refused.
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  RunProfile prof;
  Status st = p.layer->run(d.in, ov, ws.get(), bytes, stream, &prof);
  cudaGraph_t g;
  CUDA_ASSERT(cudaStreamEndCapture(stream, &g));
  cudaGraphDestroy(g);
  cudaStreamDestroy(stream);
  expect_error(st, "profile");
}

TEST(GpuContract, UnsupportedAndInvalidLayersAreRefusedAtPrepare) {
  QMOE_REQUIRE_GPU();
  TestLayer tl;
  LayerSpec s = small_spec(WeightFormat::kInt8, 16, 16, 20000, 2);
  s.fc1.block_size = s.fc2.block_size = 0;
  make_layer(s, fresh_seed(), &tl);
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("num_experts"), std::string::npos) << st.message();

  TestLayer ok;
  make_layer(small_spec(WeightFormat::kInt4), fresh_seed(), &ok);
  PrepareOptions opt;
  opt.device = 4096;
  st = prepare_layer(BackendKind::kCuda, ok.spec, ok.weights, opt, &layer);
  EXPECT_NE(st.message().find("device: expected 0.."), std::string::npos) << st.message();
}

// A NaN logit or input reaches only its own token: that row is NaN, the others match the oracle
// computed without the bad token, and take_deferred_error() names the input and the token.
TEST(GpuContract, NonFiniteInputsAreDeferredErrors) {
  QMOE_REQUIRE_GPU();
  for (int which = 0; which < 2; ++which) {
    for (int64_t tokens : {6, 40}) {
      const uint64_t seed = fresh_seed();
      Prepared p;
      LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
      prepare(s, seed, &p);  // f32: errors compare tightly
      TestInputs ti;
      make_inputs(p.tl.spec, tokens, seed, false, &ti);
      const int64_t bad = 3;
      float* x = reinterpret_cast<float*>(ti.x.data());
      float* lg = reinterpret_cast<float*>(ti.logits.data());
      if (which == 0) {
        lg[bad * s.num_experts + 5] = std::numeric_limits<float>::quiet_NaN();
      } else {
        x[bad * s.hidden + 7] = std::numeric_limits<float>::infinity();
      }
      DeviceInputs d;
      ASSERT_TRUE(stage_inputs(ti, &d));
      GpuBuffer ws, out;
      ASSERT_TRUE(ws.allocate(p.layer->workspace_size(tokens)));
      ASSERT_TRUE(out.allocate(static_cast<size_t>(tokens * s.hidden) * 4));
      MutableTensorView ov(out.get(), DType::kF32, {tokens, s.hidden});
      Status st = p.layer->run(d.in, ov, ws.get(), ws.bytes(), nullptr);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      st = p.layer->take_deferred_error();
      EXPECT_FALSE(st.is_ok());
      EXPECT_NE(st.message().find(which == 0 ? "router_probs" : "input"), std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find("first at token 3"), std::string::npos) << st.message();
      EXPECT_TRUE(p.layer->take_deferred_error().is_ok()) << "the error is cleared once taken";
      std::vector<float> got;
      ASSERT_TRUE(out.download(&got));
      // The oracle without the bad token: give it finite values there and skip its row.
      if (which == 0)
        lg[bad * s.num_experts + 5] = 0.0f;
      else
        x[bad * s.hidden + 7] = 0.0f;
      std::vector<double> ref;
      ASSERT_TRUE(reference_forward(p.tl.spec, p.tl.weights, ti.in, &ref).is_ok());
      double num = 0, den = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t c = 0; c < s.hidden; ++c) {
          const double g = got[t * s.hidden + c];
          if (t == bad) {
            if (which == 0) ASSERT_TRUE(std::isnan(g)) << "column " << c;
            continue;
          }
          ASSERT_FALSE(std::isnan(g)) << "token " << t << " column " << c;
          const double r = ref[t * s.hidden + c];
          num += (g - r) * (g - r);
          den += r * r;
        }
      }
      EXPECT_LE(std::sqrt(num / den), gpu_budget(DType::kF32));
    }
  }
}

TEST(GpuContract, WorkspaceSizeIsMonotoneAndSmallForDecode) {
  QMOE_REQUIRE_GPU();
  // The dequantize path's layout (the mixed-input GEMM needs no scratch at all).
  Prepared p;
  LayerSpec s = small_spec(WeightFormat::kInt4, 512, 256, 64, 8);
  s.act_dtype = DType::kBF16;
  prepare(s, fresh_seed(), &p, with_gemm("cutlass-dequant"));
  size_t prev = 0;
  for (int64_t t = 1; t <= 4200; t += (t < 80 ? 1 : 97)) {
    const size_t w = p.layer->workspace_size(t);
    EXPECT_GE(w, prev) << "tokens " << t;
    prev = w;
  }
  // Decode: routing needs no temporary storage and the scratch holds only the experts the call
  // can touch (k of them for one token), never the prefill sizes; the fused kernel adds its
  // partial sums (I / 64 slices of k rows of H fp32 at one token: 64 KiB).
  const size_t one = p.layer->workspace_size(1);
  const size_t per_expert = static_cast<size_t>(2 * 256 * 512) * 2;  // FC1 [2I, H] in bf16
  const size_t partials = static_cast<size_t>(256 / 64) * 8 * 512 * 4;
  EXPECT_LT(one, 9 * per_expert + partials + (size_t{1} << 16)) << one;
  EXPECT_GE(one, 8 * per_expert);
}

TEST(GpuContract, ProfileReportsStages) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Prepared p;
  LayerSpec s = small_spec(WeightFormat::kInt4, 512, 256, 16, 4);
  s.act_dtype = DType::kBF16;
  prepare(s, seed, &p);
  TestInputs ti;
  make_inputs(p.tl.spec, 64, seed, false, &ti);
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(ti, &d));
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(p.layer->workspace_size(64)));
  ASSERT_TRUE(out.allocate(64 * 512 * 2));
  MutableTensorView ov(out.get(), s.act_dtype, {64, 512});
  RunProfile prof;
  ASSERT_TRUE(p.layer->run(d.in, ov, ws.get(), ws.bytes(), nullptr, &prof).is_ok());
  EXPECT_GT(prof.route_us, 0);
  EXPECT_GT(prof.fc1_us, 0);
  EXPECT_GT(prof.fc2_us, 0);
  EXPECT_GT(prof.combine_us, 0);
}

}  // namespace
}  // namespace qmoe::test

// FP8 activations (PrepareOptions::act_quant = "fp8_e4m3"): the generic path's rows quantized to
// e4m3 per 128 columns and both FCs on the FP8 grouped GEMM (cutlass_fp8.h).
//   - The gathered rows' codes and scales bit for bit against core/act_quant.h's host twin.
//   - The activation's FP8 rows: test_gpu_activation.cpp (every row order and activation).
//   - Whole layers (fp8_block b128, per-expert fp8 and MXFP4 with H and I not multiples of 128,
//     fused and separate FC3, bf16 and f16, odd
//     token counts, experts without routes, every route on one expert) against the fp64 oracle
//     within the mode's budget, and measurably less exact than the bf16 path (so the FP8 path
//     ran). Graph replay bitwise equal to eager; the workspace's poison does not matter.
//   - What the mode cannot run is an error naming act_quant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/act_quant.h"
#include "core/numeric.h"
#include "cuda/layer/stages.h"
#include "gpu_layer_harness.h"
#include "test_util.h"

namespace qmoe::test {
namespace {

// The mode's budget on relative_norm_error (qmoe/backend.h): two e4m3 roundings (FC1's and FC2's
// inputs), each at most 2^-4 relative per value.
constexpr double kFp8ActBudget = kFp8ActErrorBudget;

PrepareOptions fp8_options(const std::string& dispatch = "generic") {
  PrepareOptions o = with_dispatch(dispatch);
  o.act_quant = "fp8_e4m3";
  return o;
}

LayerSpec fp8_spec(WeightFormat w, DType dt, int64_t h, int64_t i, int64_t e, int k) {
  LayerSpec s = small_spec(w, h, i, e, k);
  s.act_dtype = dt;
  for (FcFormat* f : {&s.fc1, &s.fc2, &s.fc3}) {
    f->block_size = w == WeightFormat::kFp8 ? 0 : 128;
    f->scale_dtype = DType::kF32;
  }
  return s;
}

// FP8 error within the budget and above twice the bf16/f16 path's on the same inputs. one_expert:
// expert 0's logit dominates every token's (with top-1, its group holds every route).
void check_fp8_layer(const LayerSpec& s, int64_t tokens, bool one_expert = false) {
  SCOPED_TRACE(layer_name(s) + ", " + std::to_string(tokens) + " tokens, E " +
               std::to_string(s.num_experts) + ", k " + std::to_string(s.routing.top_k));
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed, false, &ti);
  if (one_expert) {
    for (int64_t t = 0; t < tokens; ++t) {
      store_float(ti.logits.data(), s.act_dtype, t * s.num_experts, 20.0f);
    }
  }
  GpuRun fp8, exact;
  gpu_run(tl, ti, &fp8, fp8_options());
  if (::testing::Test::HasFatalFailure()) return;
  gpu_run(tl, ti, &exact, with_dispatch("generic"));
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_LE(fp8.error, kFp8ActBudget) << "seed " << seed;
  EXPECT_GT(fp8.error, 2 * exact.error) << "the FP8 path did not run? exact " << exact.error;
}

// H = 320: the last group holds 64 values and 64 zero codes (gpt-oss's 2880 = 22.5 x 128).
TEST(GpuFp8Act, GatheredRowsEqualTheHostTwin) {
  QMOE_REQUIRE_GPU();
  const std::pair<DType, int64_t> cases[] = {
      {DType::kBF16, 384}, {DType::kF16, 384}, {DType::kBF16, 320}, {DType::kF16, 320}};
  for (const auto& [dt, H] : cases) {
    SCOPED_TRACE("H " + std::to_string(H));
    const int64_t T = 37, slots = 3, R = T * slots, ldq = 416, G = (H + 127) / 128;
    const uint64_t seed = fresh_seed();
    std::vector<float> x = gaussian(static_cast<size_t>(T * H), seed, 3.0f);
    for (int64_t c = 0; c < 128; ++c) x[static_cast<size_t>(5 * H + 128 + c)] = 0.0f;  // a zero group
    for (int64_t c = 0; c < H; ++c) x[static_cast<size_t>(7 * H + c)] *= 1e-4f;  // a small row
    std::vector<uint8_t> xin(static_cast<size_t>(T * H) * 2);
    std::vector<float> rounded(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      store_float(xin.data(), dt, static_cast<int64_t>(i), x[i]);
      rounded[i] = load_float(xin.data(), dt, static_cast<int64_t>(i));
    }
    std::vector<int32_t> perm(static_cast<size_t>(R));
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[(seed + i * 7919) % (i + 1)]);
    GpuBuffer din, dperm, dq, ds, derr, tq, ts;
    ASSERT_TRUE(din.upload(xin));
    ASSERT_TRUE(dperm.upload(perm));
    ASSERT_TRUE(dq.allocate(static_cast<size_t>(R * ldq), 0xCD));
    ASSERT_TRUE(ds.allocate(static_cast<size_t>(R * G) * 4, 0xCD));
    ASSERT_TRUE(tq.allocate(static_cast<size_t>(T * ldq), 0xCD));
    ASSERT_TRUE(ts.allocate(static_cast<size_t>(T * G) * 4, 0xCD));
    const int32_t clear[4] = {0, INT32_MAX, 0, INT32_MAX};
    ASSERT_TRUE(derr.upload(clear, sizeof(clear)));
    const Status st = cuda::launch_gather_fp8(
        din.get(), dt, H, T, static_cast<const int32_t*>(dperm.get()), static_cast<int>(slots),
        static_cast<uint8_t*>(tq.get()), static_cast<float*>(ts.get()),
        static_cast<uint8_t*>(dq.get()), ldq, static_cast<float*>(ds.get()),
        static_cast<int32_t*>(derr.get()), nullptr);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<uint8_t> q;
    std::vector<float> sc;
    ASSERT_TRUE(dq.download(&q));
    ASSERT_TRUE(ds.download(&sc));
    std::vector<float> rows(static_cast<size_t>(R * H));
    for (int64_t p = 0; p < R; ++p) {
      std::memcpy(&rows[static_cast<size_t>(p * H)], &rounded[static_cast<size_t>(perm[p] / slots * H)],
                  static_cast<size_t>(H) * 4);
    }
    std::vector<uint8_t> want_q(static_cast<size_t>(R * ldq), 0xCD);
    std::vector<float> want_s(static_cast<size_t>(R * G));
    quantize_rows_e4m3(rows.data(), H, R, H, want_q.data(), ldq, want_s.data());
    int zero_groups = 0;
    for (size_t i = 0; i < sc.size(); ++i) {
      ASSERT_EQ(std::memcmp(&sc[i], &want_s[i], 4), 0) << "scale " << i << ": " << sc[i] << " vs " << want_s[i];
      zero_groups += sc[i] == 0.0f;
    }
    EXPECT_EQ(zero_groups, static_cast<int>(slots));  // the zero group, once per slot
    EXPECT_EQ(q, want_q) << dtype_name(dt);  // the padding columns untouched
    int32_t err[4];
    CUDA_ASSERT(cudaMemcpy(err, derr.get(), sizeof(err), cudaMemcpyDeviceToHost));
    EXPECT_EQ(err[0], 0);
  }
}

// The host conversion is the device's cvt.rn.satfinite: every code of a fine sweep through e4m3's
// range (subnormals, ties, saturation) and the group scale's corner cases.
TEST(Fp8ActQuant, HostCodesAndScales) {
  EXPECT_EQ(e4m3_group_scale(448.0f), 1.0f);
  EXPECT_EQ(e4m3_group_inverse(448.0f), 1.0f);
  EXPECT_EQ(e4m3_group_inverse(0.0f), 0.0f);  // an all-zero group: zero codes
  EXPECT_EQ(e4m3_group_code(1.0f, 0.0f), 0);
  EXPECT_EQ(e4m3_group_code(448.0f, 1.0f), 0x7E);
  EXPECT_EQ(e4m3_group_code(-448.0f, 1.0f), 0xFE);
  EXPECT_EQ(e4m3_group_code(1000.0f, 1.0f), 0x7E);  // saturates
  EXPECT_EQ(e4m3_group_code(0.001953125f, 1.0f), 0x01);  // 2^-9, the smallest subnormal
  EXPECT_EQ(e4m3_group_code(1.0625f, 1.0f), 0x38);  // tie between 1 and 1.125: even
  EXPECT_EQ(e4m3_group_code(1.1875f, 1.0f), 0x3A);  // tie between 1.125 and 1.25: even
  std::vector<float> row(128);
  for (int i = 0; i < 128; ++i) row[static_cast<size_t>(i)] = (i - 64) * 0.37f;
  std::vector<uint8_t> q(128);
  float s = 0;
  quantize_rows_e4m3(row.data(), 128, 1, 128, q.data(), 128, &s);
  EXPECT_EQ(s, 64 * 0.37f / 448.0f);
  EXPECT_EQ(q[0], 0xFE);  // -amax -> -448
  for (int i = 0; i < 128; ++i) {
    const float back = num::e4m3_to_f32(q[static_cast<size_t>(i)]) * s;
    EXPECT_LE(std::fabs(back - row[static_cast<size_t>(i)]),
              0.0626f * std::fabs(row[static_cast<size_t>(i)]) + s * 0.001953125f)
        << i;
  }
}

TEST(GpuFp8Act, LayersMatchTheOracleWithinTheBudget) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (WeightFormat wf : {WeightFormat::kFp8Block, WeightFormat::kFp8}) {
      // 5, 129 and 333 tokens x 4 routes over 16 experts take the 64-row tile, 1100 (275 rows
      // per expert) the 128-row one (kFp8WideRoutes).
      for (int64_t tokens : {5, 129, 333, 1100}) {
        check_fp8_layer(fp8_spec(wf, dt, 256, 128, 16, 4), tokens);
      }
      // DeepSeek-V3's form, a separate FC3 (joined with FC1 at prepare); with biases it stays
      // apart (a GEMM of its own); and the concatenated gate.
      LayerSpec f3 = fp8_spec(wf, dt, 384, 256, 16, 4);
      f3.activation.glu = GluLayout::kSeparateFc3;
      check_fp8_layer(f3, 129);
      LayerSpec f3_bias = f3;
      f3_bias.has_fc1_bias = f3_bias.has_fc2_bias = f3_bias.has_fc3_bias = true;
      check_fp8_layer(f3_bias, 77);
      LayerSpec concat = fp8_spec(wf, dt, 384, 256, 8, 2);
      concat.activation.glu = GluLayout::kConcatenated;
      check_fp8_layer(concat, 77);
    }
  }
  // FC1 over 5 K tiles and FC2 over 4: the mainloop's two-tile loop runs more than once, with an
  // odd and an even tile count (cutlass_fp8_mainloop.cuh; the shapes above have 1 to 3).
  check_fp8_layer(fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 640, 512, 16, 4), 129);
  check_fp8_layer(fp8_spec(WeightFormat::kFp8, DType::kF16, 640, 512, 16, 4), 1100);
  // Many experts, few routes (most experts without a row), and every route on one expert.
  check_fp8_layer(fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 256, 128, 64, 2), 7);
  check_fp8_layer(fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 256, 128, 16, 1), 300, true);
}

// A decode call (1 and 3 tokens) of the layer with FP8 activations is the plain layer's, bit for
// bit: act_quant changes the generic path only.
void expect_decode_calls_plain(const TestLayer& tl, uint64_t seed) {
  for (int64_t tokens : {1, 3}) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    GpuRun fp8, plain;
    gpu_run(tl, ti, &fp8, fp8_options("decode/1"));
    if (::testing::Test::HasFatalFailure()) return;
    gpu_run(tl, ti, &plain, with_dispatch("decode/1"));
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(fp8.out, plain.out) << tokens << " tokens, seed " << seed;
  }
}

LayerSpec mxfp4_spec(DType dt, int64_t h, int64_t i, int64_t e, int k) {
  LayerSpec s = small_spec(WeightFormat::kMxFp4, h, i, e, k);
  s.act_dtype = dt;
  return s;
}

// gpt-oss's form at a small size: H and I not multiples of 128 (2.5 and 1.5 groups: K padded to
// whole groups), FC biases, the clamped SwiGLU.
LayerSpec gpt_oss_like(DType dt) {
  LayerSpec s = mxfp4_spec(dt, 320, 192, 8, 4);
  s.has_fc1_bias = s.has_fc2_bias = true;
  s.activation.alpha = 1.702f;
  s.activation.limit = 7.0f;
  s.activation.beta = 1.0f;
  return s;
}

// MXFP4 through its exact e4m3 copy with row scales on the FP8 GEMM: both tiles, both dtypes,
// gpt-oss's form, and a separate FC3 (joined with FC1).
TEST(GpuFp8Act, Mxfp4LayersMatchTheOracleWithinTheBudget) {
  QMOE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int64_t tokens : {5, 129, 333, 1100}) {
      check_fp8_layer(mxfp4_spec(dt, 256, 128, 16, 4), tokens);
    }
    for (int64_t tokens : {7, 333, 1100}) check_fp8_layer(gpt_oss_like(dt), tokens);
  }
  check_fp8_layer(mxfp4_spec(DType::kBF16, 640, 512, 16, 4), 333);  // 5 and 4 K tiles
  LayerSpec f3 = mxfp4_spec(DType::kBF16, 384, 256, 16, 4);
  f3.activation.glu = GluLayout::kSeparateFc3;
  check_fp8_layer(f3, 129);
  check_fp8_layer(mxfp4_spec(DType::kBF16, 256, 128, 16, 1), 300, true);  // one expert
}

// The MXFP4 FP8 layer's graph replay equals its eager call, its workspace poison does not
// matter, its dispatch window is MXFP4's, and its decode calls are the plain layer's bit for bit
// (the raw codes it frees were the generic path's only).
TEST(GpuFp8Act, Mxfp4ReplayPoisonAndDecode) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(gpt_oss_like(DType::kBF16), seed, &tl);
  std::unique_ptr<PreparedLayer> layer;
  const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, fp8_options(), &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  check_replay_and_poison(tl, layer.get(), seed, 333, 300);
  // The analytic window of MXFP4 with FP8 activations (4 routes per expert at this size: 8 tokens
  // of top 4 over 8 experts), not the 64-token floor of other FP8 layers.
  std::unique_ptr<PreparedLayer> auto_layer;
  PrepareOptions o;
  o.act_quant = "fp8_e4m3";
  ASSERT_TRUE(prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, o, &auto_layer).is_ok());
  EXPECT_EQ(auto_layer->dispatch_choice(8), "decode/1");
  EXPECT_EQ(auto_layer->dispatch_choice(9), "generic");
  expect_decode_calls_plain(tl, seed);
}

// act_quant changes the generic path only: a decode call of an FP8-activation layer is the plain
// layer's, bit for bit (the decode kernels' f32 FC2 rows, finalized as f32 in the workspace the
// FP8 path sizes for its bf16 rows), at DeepSeek-V3's shape class (H > 2I: FC2's f32 rows are the
// larger part).
TEST(GpuFp8Act, DecodeCallsAreThePlainLayers) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 768, 128, 16, 4);
  s.activation.glu = GluLayout::kSeparateFc3;
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(s, seed, &tl);
  expect_decode_calls_plain(tl, seed);
}

// A bf16 fp8_block layer prepared with FP8 activations on the generic path.
void prepare_fp8_layer(uint64_t seed, TestLayer* tl, std::unique_ptr<PreparedLayer>* layer) {
  make_layer(fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 256, 128, 16, 4), seed, tl);
  const Status st = prepare_layer(BackendKind::kCuda, tl->spec, tl->weights, fp8_options(), layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
}

TEST(GpuFp8Act, GraphReplayEqualsEagerAndPoisonDoesNotMatter) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  std::unique_ptr<PreparedLayer> layer;
  prepare_fp8_layer(seed, &tl, &layer);
  if (HasFatalFailure()) return;
  check_replay_and_poison(tl, layer.get(), seed, 333, 300);
  size_t prev = 0;
  for (int64_t t = 1; t <= 2000; t += (t < 70 ? 1 : 117)) {
    const size_t w = layer->workspace_size(t);
    EXPECT_GE(w, prev) << "tokens " << t;
    prev = w;
  }
}

// A non-finite input still reports its token, as on the bf16 path.
TEST(GpuFp8Act, NonFiniteInputIsReported) {
  QMOE_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  std::unique_ptr<PreparedLayer> layer;
  prepare_fp8_layer(seed, &tl, &layer);
  if (HasFatalFailure()) return;
  TestInputs ti;
  make_inputs(tl.spec, 100, seed, false, &ti);
  store_float(ti.x.data(), DType::kBF16, 42 * 256 + 17, std::nanf(""));
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(ti, &d));
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(layer->workspace_size(100)));
  ASSERT_TRUE(out.allocate(100 * 256 * 2));
  MutableTensorView ov(out.get(), DType::kBF16, {100, 256});
  ASSERT_TRUE(layer->run(d.in, ov, ws.get(), layer->workspace_size(100), nullptr).is_ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  const Status st = layer->take_deferred_error();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("first at token 42"), std::string::npos) << st.to_string();
}

TEST(GpuFp8Act, WhatTheModeCannotRunIsAnError) {
  QMOE_REQUIRE_GPU();
  auto expect_error = [](const LayerSpec& s, const std::string& part) {
    TestLayer tl;
    make_layer(s, fresh_seed(), &tl);
    std::unique_ptr<PreparedLayer> layer;
    const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, fp8_options(), &layer);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("act_quant"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find(part), std::string::npos) << st.to_string();
    EXPECT_EQ(layer, nullptr);
  };
  LayerSpec int4 = small_spec(WeightFormat::kInt4, 256, 128, 8, 2);
  int4.act_dtype = DType::kBF16;
  int4.fc1.block_size = int4.fc2.block_size = 128;
  expect_error(int4, "int4");
  LayerSpec b64 = fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 256, 128, 8, 2);
  b64.fc1.block_size = b64.fc2.block_size = 64;
  expect_error(b64, "b64");
  expect_error(fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 320, 128, 8, 2), "fc1");  // H
  expect_error(fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 256, 96, 8, 2), "fc2");   // I
  {
    // An MXFP4 chunk whose second block lies 20 binades below its first: no exact e4m3 copy.
    TestLayer tl;
    make_layer(mxfp4_spec(DType::kBF16, 256, 128, 8, 2), fresh_seed(), &tl);
    tl.fc1.scales[0] = static_cast<uint8_t>(std::min(252, tl.fc1.scales[1] + 20));
    bind_weights(&tl);
    std::unique_ptr<PreparedLayer> layer;
    const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, fp8_options(), &layer);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("act_quant"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("MXFP4"), std::string::npos) << st.to_string();
    EXPECT_EQ(layer, nullptr);
  }
  LayerSpec f32 = fp8_spec(WeightFormat::kFp8Block, DType::kF32, 256, 128, 8, 2);
  expect_error(f32, "f32");
  // The environment's spelling, checked like the field.
  EnvOverride env("QMOE_ACT_QUANT", "fp4");
  TestLayer tl;
  make_layer(fp8_spec(WeightFormat::kFp8Block, DType::kBF16, 256, 128, 8, 2), fresh_seed(), &tl);
  std::unique_ptr<PreparedLayer> layer;
  const Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("QMOE_ACT_QUANT"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace qmoe::test

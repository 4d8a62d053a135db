// The generic path on CUTLASS's grouped GEMM (the default for bf16/f16 layers) against the mma.sync
// kernel (PrepareOptions::gemm = "mma") and the fp64 oracle: both within the dtype's budget, the
// choice read at prepare (option, then $QMOE_GEMM) with bad values named, graph replay bitwise
// equal to the eager run on a poisoned workspace, and the workspace formula still monotone.
#include <gtest/gtest.h>

#include <string>

#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

// A random bf16/f16 INT4 or INT8 layer (H 256, I 128, 16 experts, k 4) and inputs of `tokens`.
struct LayerCase {
  TestLayer tl;
  TestInputs ti;
  LayerCase(WeightFormat f, DType dt, int64_t tokens) {
    const uint64_t seed = fresh_seed();
    LayerSpec s = small_spec(f, 256, 128, 16, 4);
    s.act_dtype = dt;
    make_layer(s, seed, &tl);
    make_inputs(tl.spec, tokens, seed, false, &ti);
  }
};

// Shapes the CUTLASS kernel takes (N a multiple of 4) and one it leaves to mma.sync (H = 250:
// FC2's N), on the generic path (dispatch "generic"), at token counts with empty experts
// (5 tokens over 16 experts), ragged groups and several full N tiles.
TEST(GpuCutlassLayer, BothGemmsMatchTheOracle) {
  QMOE_REQUIRE_GPU();
  const PrepareOptions generic = with_dispatch("generic");
  for (DType dt : {DType::kBF16, DType::kF16}) {
    for (int64_t hidden : {256, 250}) {
      LayerSpec s = small_spec(WeightFormat::kInt4, hidden, 128, 16, 4);
      s.act_dtype = dt;
      // Per channel: FC1's K = 250 has no 128-wide blocks.
      if (hidden % 128 != 0) s.fc1.block_size = 0;
      for (const char* gemm : {"cutlass", "mma"}) {
        for (int64_t tokens : {5, 300, 1100}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + " H " + std::to_string(hidden) + " gemm " +
                       gemm + " tokens " + std::to_string(tokens));
          check_gpu_case(s, tokens, false, with_gemm(gemm, generic));
        }
      }
    }
  }
}

// Waves: a dequantization cap of two experts runs 16 experts in 8 CUTLASS launches, each with its
// own groups; the output equals the single-wave run bit for bit.
TEST(GpuCutlassLayer, WavesMatchOneWaveBitwise) {
  QMOE_REQUIRE_GPU();
  const PrepareOptions generic = with_dispatch("generic");
  LayerCase c(WeightFormat::kInt8, DType::kBF16, 400);
  GpuRun one, waves;
  gpu_run(c.tl, c.ti, &one, with_gemm("cutlass", generic));
  PrepareOptions capped = with_gemm("cutlass", generic);
  capped.max_dequant_bytes = 2 * 2 * 256 * 256;  // two experts' FC1 [2I, H] in bf16
  gpu_run(c.tl, c.ti, &waves, capped);
  EXPECT_LE(one.error, gpu_budget(DType::kBF16));
  EXPECT_TRUE(one.out == waves.out) << "waves change the output bits";
}

TEST(GpuCutlassLayer, GraphReplayEqualsEager) {
  QMOE_REQUIRE_GPU();
  const int64_t tokens = 333;
  LayerCase c(WeightFormat::kInt4, DType::kF16, tokens);
  const LayerSpec& s = c.tl.spec;
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, s, c.tl.weights,
                            with_gemm("cutlass", with_dispatch("generic")), &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  GpuRun eager;
  gpu_run(c.tl, c.ti, &eager, {}, 0xFF, false, layer.get());

  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(c.ti, &d));
  const size_t bytes = layer->workspace_size(tokens);
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(bytes, 0x7F, 256));  // another poison than the eager run's
  ASSERT_TRUE(out.allocate(static_cast<size_t>(tokens * s.hidden) * 2));
  MutableTensorView ov(out.get(), s.act_dtype, {tokens, s.hidden});
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  st = layer->run(d.in, ov, ws.get(), bytes, stream);
  CUDA_ASSERT(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) CUDA_ASSERT(cudaGraphLaunch(exec, stream));
  CUDA_ASSERT(cudaStreamSynchronize(stream));
  std::vector<uint8_t> replay;
  ASSERT_TRUE(out.download(&replay));
  EXPECT_TRUE(ws.canary_intact());
  EXPECT_TRUE(replay == eager.out) << "graph replay differs from the eager run";
  CUDA_ASSERT(cudaGraphExecDestroy(exec));
  CUDA_ASSERT(cudaGraphDestroy(graph));
  CUDA_ASSERT(cudaStreamDestroy(stream));
}

TEST(GpuCutlassLayer, ChoiceIsReadAtPrepareAndBadValuesAreNamed) {
  QMOE_REQUIRE_GPU();
  LayerCase c(WeightFormat::kInt4, DType::kBF16, 1);
  const TestLayer& tl = c.tl;
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, with_gemm("cublas"), &layer);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("gemm"), std::string::npos) << st.to_string();
  {
    // QMOE_GEMM is read at prepare (resolve_prepare_options; test_prepare_options.cpp covers
    // its parsing): a bad value fails prepare, naming it, and the option wins over it.
    EnvOverride bad("QMOE_GEMM", "fast");
    st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, {}, &layer);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("QMOE_GEMM"), std::string::npos) << st.to_string();
    st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, with_gemm("mma"), &layer);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  std::unique_ptr<PreparedLayer> mma, cutlass;
  ASSERT_TRUE(
      prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, with_gemm("mma"), &mma).is_ok());
  // cutlass-dequant: the mixed-input GEMM has no scratch.
  ASSERT_TRUE(
      prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, with_gemm("cutlass-dequant"), &cutlass)
          .is_ok());
  // CUTLASS's arrays and descriptors are the only difference in the workspace; both monotone.
  size_t prev = 0;
  for (int64_t t = 1; t <= 3000; t += (t < 80 ? 1 : 131)) {
    const size_t a = mma->workspace_size(t), b = cutlass->workspace_size(t);
    EXPECT_GT(b, a) << "tokens " << t;
    EXPECT_GE(b, prev) << "tokens " << t;
    prev = b;
  }
  EXPECT_EQ(mma->workspace_size(0), cutlass->workspace_size(0));
}

}  // namespace
}  // namespace qmoe::test

// Calls of zero tokens on the CUDA backend: ok, nothing written (poisoned buffers stay poison),
// nothing launched (a graph captured around the call has no node, where a one-token call's has
// some), null pointers and a null workspace accepted, workspace_size(0) = 0.
#include <gtest/gtest.h>

#include <vector>

#include "gpu_layer_harness.h"

namespace qmoe::test {
namespace {

constexpr uint8_t kPoison = 0xEE;
constexpr size_t kBlock = 4096;

// Nodes of the graph captured around one run() on `stream` (-1 when the capture failed).
int64_t captured_nodes(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                       void* ws, size_t bytes, cudaStream_t stream, Status* st) {
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1;
  *st = layer.run(in, out, ws, bytes, stream);
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || graph == nullptr) return -1;
  size_t n = 0;
  const cudaError_t e = cudaGraphGetNodes(graph, nullptr, &n);
  cudaGraphDestroy(graph);
  return e == cudaSuccess ? static_cast<int64_t>(n) : -1;
}

::testing::AssertionResult still_poison(const GpuBuffer& b, const char* name) {
  std::vector<uint8_t> bytes;
  auto r = b.download(&bytes);
  if (!r) return r;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != kPoison) return ::testing::AssertionFailure() << name << " byte " << i;
  }
  return ::testing::AssertionSuccess();
}

void check_zero_tokens(const LayerSpec& spec) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(spec, seed, &tl);
  const LayerSpec& s = tl.spec;
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, s, tl.weights, {}, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(layer->workspace_size(0), 0u);
  EXPECT_EQ(layer->workspace_size(-1), 0u);
  for (int64_t t = 1; t <= 80; ++t) {
    EXPECT_LE(layer->workspace_size(t - 1), layer->workspace_size(t)) << "tokens " << t;
  }
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Positive control: a one-token call captures some nodes.
  {
    TestInputs ti;
    make_inputs(s, 1, seed, false, &ti);
    DeviceInputs d;
    ASSERT_TRUE(stage_inputs(ti, &d));
    GpuBuffer ws, out;
    ASSERT_TRUE(ws.allocate(layer->workspace_size(1)));
    ASSERT_TRUE(out.allocate(static_cast<size_t>(s.hidden) * dtype_size(s.act_dtype)));
    const MutableTensorView ov(out.get(), s.act_dtype, {1, s.hidden});
    const int64_t nodes = captured_nodes(*layer, d.in, ov, ws.get(), ws.bytes(), stream, &st);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_GT(nodes, 0) << "a one-token call must capture its kernels";
  }

  GpuBuffer x, logits, rw, out, ws;
  for (GpuBuffer* b : {&x, &logits, &rw, &out, &ws}) ASSERT_TRUE(b->allocate(kBlock, kPoison));
  for (int form = 0; form < 3; ++form) {
    for (bool with_rw : {false, true}) {
      for (bool null_data : {true, false}) {
        SCOPED_TRACE("form " + std::to_string(form) + (with_rw ? " router_weights" : "") +
                     (null_data ? " null pointers" : " poisoned buffers"));
        auto ptr = [&](GpuBuffer& b) { return null_data ? nullptr : b.get(); };
        const std::vector<int64_t> shape = form == 0   ? std::vector<int64_t>{0, s.hidden}
                                           : form == 1 ? std::vector<int64_t>{4, 0, s.hidden}
                                                       : std::vector<int64_t>{0, 3, s.hidden};
        RunInputs in;
        in.input = shaped_view<TensorView>(ptr(x), s.act_dtype, shape);
        in.router_logits = shaped_view<TensorView>(ptr(logits), s.act_dtype, {0, s.num_experts});
        if (with_rw) {
          in.router_weights = shaped_view<TensorView>(ptr(rw), s.act_dtype, {0, s.num_experts});
        }
        const MutableTensorView ov = shaped_view<MutableTensorView>(ptr(out), s.act_dtype, shape);
        EXPECT_EQ(captured_nodes(*layer, in, ov, ptr(ws), null_data ? 0 : kBlock, stream, &st), 0)
            << "a zero-token call launched work";
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        RunProfile profile;
        profile.route_us = profile.fc1_us = 5.0;
        st = layer->run(in, ov, ptr(ws), null_data ? 0 : kBlock, stream, &profile);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        EXPECT_EQ(profile.total_us(), 0.0);
        st = layer->run(in, ov, ptr(ws), null_data ? 0 : kBlock, nullptr);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
      }
    }
  }
  // Host pointers are not looked at for an empty call either.
  std::vector<uint8_t> host(kBlock, kPoison);
  RunInputs in;
  in.input = TensorView(host.data(), s.act_dtype, {0, s.hidden});
  in.router_logits = TensorView(host.data(), s.act_dtype, {0, s.num_experts});
  st = layer->run(in, MutableTensorView(host.data(), s.act_dtype, {0, s.hidden}), nullptr, 0,
                  stream);
  EXPECT_TRUE(st.is_ok()) << st.to_string();

  CUDA_ASSERT(cudaDeviceSynchronize());
  for (uint8_t b : host) ASSERT_EQ(b, kPoison) << "host buffer written";
  EXPECT_TRUE(still_poison(x, "input"));
  EXPECT_TRUE(still_poison(logits, "router_probs"));
  EXPECT_TRUE(still_poison(rw, "router_weights"));
  EXPECT_TRUE(still_poison(out, "output"));
  EXPECT_TRUE(still_poison(ws, "workspace"));
  st = layer->take_deferred_error();
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  cudaStreamDestroy(stream);
}

TEST(GpuZeroTokens, DecodeLayerLaunchesNothing) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  s.act_dtype = DType::kBF16;
  check_zero_tokens(s);
}

TEST(GpuZeroTokens, GenericLayerLaunchesNothing) {
  QMOE_REQUIRE_GPU();
  LayerSpec s = small_spec(WeightFormat::kInt8, 256, 128, 8, 2);
  s.activation.glu = GluLayout::kSeparateFc3;  // f32 with FC3: the generic path only
  s.has_fc2_bias = true;
  check_zero_tokens(s);
}

}  // namespace
}  // namespace qmoe::test

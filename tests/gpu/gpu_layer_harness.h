// Runs a layer on the CUDA backend the way the GPU suite wants it checked: device inputs, an
// exactly sized workspace full of poison with canaries after it, a poisoned output, then the
// output compared with the fp64 oracle.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "layer_factory.h"

namespace qmoe::test {

// Relative-norm budgets of the GPU generic path against the fp64 oracle. bf16/f16 layers compute
// on tensor cores with weights and the activation rounded to the layer's dtype (unit roundoff
// 2^-9 for bf16, 2^-11 for f16): four roundings of RMS u/sqrt(3) each (FC1 weights, the
// activation, FC2 weights, the output) add up to about 2.3e-3 (bf16) / 5.6e-4 (f16), and the
// gated activation can double that. fp32 layers accumulate in fp32 like the CPU backend.
inline double gpu_budget(DType t) {
  switch (t) {
    case DType::kF16:
      return 2.5e-3;
    case DType::kBF16:
      return 1e-2;
    default:
      return 2e-5;
  }
}

struct DeviceInputs {
  GpuBuffer x, logits, rw;
  RunInputs in;
};

// input_offset: the input starts that many bytes into its allocation (an unaligned input).
inline ::testing::AssertionResult stage_inputs(const TestInputs& ti, DeviceInputs* d,
                                               size_t input_offset = 0) {
  d->in = ti.in;
  auto r = d->x.upload(ti.x.data(), ti.x.size() * sizeof(ti.x[0]), input_offset);
  if (!r) return r;
  d->in.input.data = static_cast<char*>(d->x.get()) + input_offset;
  r = d->logits.upload(ti.logits);
  if (!r) return r;
  d->in.router_logits.data = d->logits.get();
  if (ti.in.router_weights.present()) {
    r = d->rw.upload(ti.router_weights);
    if (!r) return r;
    d->in.router_weights.data = d->rw.get();
  }
  return ::testing::AssertionSuccess();
}

// An integer-code case of the decode tests: the width, the scale block (inside a chunk, spanning
// chunks, 0 per channel), zero points and the activation dtype.
struct IntCase {
  WeightFormat f;
  int block;
  bool zp;
  DType dt;
};

// small_spec(c.f, h, i, e, k) with c's dtype, scale blocks and zero points on both FCs.
inline LayerSpec int_case_spec(const IntCase& c, int64_t h, int64_t i, int64_t e, int64_t k) {
  LayerSpec s = small_spec(c.f, h, i, e, k);
  s.act_dtype = c.dt;
  s.fc1.block_size = s.fc2.block_size = c.block;
  s.fc1.zero_points = s.fc2.zero_points = c.zp;
  return s;
}

// PrepareOptions (over `o`) choosing the generic path's GEMM ("cutlass", "cutlass-dequant",
// "mma").
inline PrepareOptions with_gemm(const std::string& gemm, PrepareOptions o = {}) {
  o.gemm = gemm;
  return o;
}

// PrepareOptions (over `o`) forcing one dispatch choice ("generic", "decode/1", "fused"), or
// setting the decode kernel's tiles per block or weight ring (DecodeOptions).
inline PrepareOptions with_dispatch(const std::string& choice, PrepareOptions o = {}) {
  o.dispatch = choice;
  return o;
}
inline PrepareOptions with_tiles(int tiles_per_block, PrepareOptions o = {}) {
  o.decode.tiles_per_block = tiles_per_block;
  return o;
}
inline PrepareOptions with_ring(int ring, PrepareOptions o = {}) {
  o.decode.ring = ring;
  return o;
}

inline int64_t tokens_of(const RunInputs& in) {
  return in.input.dims[0] * (in.input.rank == 3 ? in.input.dims[1] : 1);
}

struct GpuRun {
  std::vector<uint8_t> out;  // raw output bytes
  std::vector<double> out_f64;
  double error = 0;
};

// Prepares `tl` on the GPU (options as given), runs `ti` once with a poisoned workspace and
// output, checks canaries and NaN-freedom, and fills res (error against the oracle when
// with_oracle).
inline void gpu_run(const TestLayer& tl, const TestInputs& ti, GpuRun* res,
                    const PrepareOptions& opt = {}, uint8_t poison = 0xFF, bool with_oracle = true,
                    PreparedLayer* reuse = nullptr, size_t input_offset = 0) {
  std::unique_ptr<PreparedLayer> own;
  PreparedLayer* layer = reuse;
  if (!layer) {
    Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, opt, &own);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    layer = own.get();
  }
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(ti, &d, input_offset));
  const int64_t t = tokens_of(ti.in);
  const size_t ws_bytes = layer->workspace_size(t);
  ASSERT_GT(ws_bytes, 0u);
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(ws_bytes, poison, 1024));
  const size_t esz = dtype_size(tl.spec.act_dtype);
  ASSERT_TRUE(out.allocate(static_cast<size_t>(t * tl.spec.hidden) * esz, 0xFF, 256));
  MutableTensorView ov(out.get(), tl.spec.act_dtype, {t, tl.spec.hidden});
  Status st = layer->run(d.in, ov, ws.get(), ws_bytes, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  CUDA_ASSERT(cudaDeviceSynchronize());
  st = layer->take_deferred_error();
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_TRUE(ws.canary_intact()) << "workspace overrun";
  ASSERT_TRUE(out.canary_intact()) << "output overrun";
  ASSERT_TRUE(out.download(&res->out));
  res->out_f64.resize(static_cast<size_t>(t * tl.spec.hidden));
  for (size_t i = 0; i < res->out_f64.size(); ++i) {
    res->out_f64[i] = load_float(res->out.data(), tl.spec.act_dtype, static_cast<int64_t>(i));
    ASSERT_FALSE(std::isnan(res->out_f64[i])) << "output " << i << " not written or NaN";
  }
  if (!with_oracle) return;
  std::vector<double> ref;
  st = reference_forward(tl.spec, tl.weights, ti.in, &ref);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  res->error = relative_norm_error(res->out_f64.data(), ref.data(), ref.size());
}

// A fresh random layer and inputs, run on the GPU, within the dtype's budget.
inline void check_gpu_case(const LayerSpec& spec, int64_t tokens, bool router_weights = false,
                           const PrepareOptions& opt = {}) {
  const uint64_t seed = fresh_seed();
  TestLayer tl;
  make_layer(spec, seed, &tl);
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed, router_weights, &ti);
  GpuRun r;
  gpu_run(tl, ti, &r, opt);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_LE(r.error, gpu_budget(spec.act_dtype))
      << "fc1 " << spec.fc1.to_string() << ", fc2 " << spec.fc2.to_string() << ", "
      << dtype_name(spec.act_dtype) << ", " << tokens << " tokens, E " << spec.num_experts << ", k "
      << spec.routing.top_k;
}

// Prepares tl (with opt: a forced choice takes the decode kernel past the default window),
// checks the path the dispatch takes for `tokens` (a decode form up to the window's end,
// expect_decode; the generic path past it), runs them and checks the error against the oracle
// (the decode kernels' tests of each format family).
inline void check_decode_call(const TestLayer& tl, int64_t tokens, uint64_t seed,
                              bool expect_decode = true, const PrepareOptions& opt = {}) {
  std::unique_ptr<PreparedLayer> layer;
  Status st = prepare_layer(BackendKind::kCuda, tl.spec, tl.weights, opt, &layer);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const std::string choice = layer->dispatch_choice(tokens);
  if (expect_decode) {
    EXPECT_EQ(choice.rfind("decode", 0), 0u) << "took " << choice << " at " << tokens << " tokens";
  } else {
    EXPECT_EQ(choice, "generic") << tokens << " tokens";
  }
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed + static_cast<uint64_t>(tokens), false, &ti);
  GpuRun r;
  gpu_run(tl, ti, &r, {}, 0xFF, true, layer.get());
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_LE(r.error, gpu_budget(tl.spec.act_dtype))
      << tl.spec.fc1.to_string() << " " << dtype_name(tl.spec.act_dtype) << ", " << tokens
      << " tokens, seed " << seed;
}

inline std::string layer_name(const LayerSpec& s) {
  return s.fc1.to_string() + " / " + s.fc2.to_string() + " " + dtype_name(s.act_dtype) + " H " +
         std::to_string(s.hidden) + " I " + std::to_string(s.inter);
}

// Calls f(tl, seed) on a fresh random layer (h, i, e, k) of each of `formats` in bf16 and f16.
template <typename Formats, typename F>
void for_layers_of(const Formats& formats, int64_t h, int64_t i, int64_t e, int k, F&& f) {
  for (WeightFormat fmt : formats) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      LayerSpec s = small_spec(fmt, h, i, e, k);
      s.act_dtype = dt;
      const uint64_t seed = fresh_seed();
      TestLayer tl;
      make_layer(s, seed, &tl);
      SCOPED_TRACE(layer_name(s));
      f(tl, seed);
    }
  }
}

// Captures one call of `tokens` on layer in a CUDA graph, replays it on `rounds` fresh inputs
// copied into the captured buffers, and checks each replay equals an eager call bit for bit (and
// that the workspace's canary survived).
inline void check_graph_replay(const TestLayer& tl, PreparedLayer* layer, int64_t tokens,
                               uint64_t seed, int rounds) {
  TestInputs first;
  make_inputs(tl.spec, tokens, seed, false, &first);
  DeviceInputs d;
  ASSERT_TRUE(stage_inputs(first, &d));
  const size_t bytes = layer->workspace_size(tokens);
  GpuBuffer ws, out;
  ASSERT_TRUE(ws.allocate(bytes, 0xFF, 256));
  const size_t out_bytes =
      static_cast<size_t>(tokens * tl.spec.hidden) * dtype_size(tl.spec.act_dtype);
  ASSERT_TRUE(out.allocate(out_bytes));
  MutableTensorView ov(out.get(), tl.spec.act_dtype, {tokens, tl.spec.hidden});
  cudaStream_t stream;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  Status st = layer->run(d.in, ov, ws.get(), bytes, stream);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  CUDA_ASSERT(end);
  cudaGraphExec_t exec;
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < rounds; ++round) {
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + 100 + round, false, &ti);
    CUDA_ASSERT(cudaMemcpy(d.x.get(), ti.x.data(), ti.x.size(), cudaMemcpyHostToDevice));
    CUDA_ASSERT(
        cudaMemcpy(d.logits.get(), ti.logits.data(), ti.logits.size(), cudaMemcpyHostToDevice));
    CUDA_ASSERT(cudaMemset(out.get(), 0xFF, out_bytes));
    CUDA_ASSERT(legacy_stream_done());
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    std::vector<uint8_t> replayed;
    ASSERT_TRUE(out.download(&replayed));
    GpuRun eager;
    gpu_run(tl, ti, &eager, {}, 0xFF, false, layer);
    EXPECT_EQ(replayed, eager.out) << "round " << round << ", " << tokens << " tokens";
  }
  ASSERT_TRUE(ws.canary_intact());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// A prepared layer's graph replay (check_graph_replay at replay_tokens) and its output on one input
// with the workspace poisoned three ways (0xFF, 0x00, 0x7F): the same bits each time.
inline void check_replay_and_poison(const TestLayer& tl, PreparedLayer* layer, uint64_t seed,
                                    int64_t replay_tokens, int64_t tokens) {
  check_graph_replay(tl, layer, replay_tokens, seed, 2);
  TestInputs ti;
  make_inputs(tl.spec, tokens, seed, false, &ti);
  GpuRun a, b, c;
  gpu_run(tl, ti, &a, {}, 0xFF, false, layer);
  gpu_run(tl, ti, &b, {}, 0x00, false, layer);
  gpu_run(tl, ti, &c, {}, 0x7F, false, layer);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
}

// The decode kernel forced (decode/1), with its tiles per block and rings, on tl at 1, 7 and 40
// tokens: within the budget; tiles per block of 4 and more, and both rings, the same bits.
inline void check_decode_tiles_and_rings(const TestLayer& tl, uint64_t seed) {
  const DType dt = tl.spec.act_dtype;
  for (int64_t tokens : {1, 7, 40}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens) + " seed " + std::to_string(seed));
    TestInputs ti;
    make_inputs(tl.spec, tokens, seed + tokens, false, &ti);
    GpuRun forced;
    gpu_run(tl, ti, &forced, with_dispatch("decode/1"));
    EXPECT_LE(forced.error, gpu_budget(dt)) << "decode/1";
    std::vector<uint8_t> first;
    for (int tpb : {4, 8}) {
      GpuRun regs, smem;
      gpu_run(tl, ti, &regs, with_ring(1, with_tiles(tpb)));
      gpu_run(tl, ti, &smem, with_ring(2, with_tiles(tpb)));
      EXPECT_LE(regs.error, gpu_budget(dt)) << tpb << " tiles per block";
      EXPECT_EQ(smem.out, regs.out) << tpb << " tiles per block";
      if (first.empty()) first = regs.out;
      EXPECT_EQ(regs.out, first) << tpb << " tiles per block differs from 4";
    }
  }
}

}  // namespace qmoe::test

// qmoe CPU backend: exact fp32 arithmetic on exactly dequantized weights, multi-threaded, and
// deterministic (each output element is produced by one task in a fixed order, whatever the thread
// count).
//
// The path of a call:
//   route()            -> RouteMaps (routes sorted by expert, stable by token)
//   FC1 (+FC3)         per touched expert, per output row: dequantize the row once, dot it with
//                      every route of that expert               -> h   [R, N1] (R = T * slots)
//   activation         per route                                 -> act [R, I]
//   FC2                per touched expert, per row, as FC1       -> y   [R, H]
//   combine            per token: sum_j w_j * y[route j] in slot order, in fp32, cast to the dtype
// Rows of h, act and y are indexed by a route's position in expert order, so an expert's routes
// are contiguous.
//
// Local experts (LayerSpec::first_expert, local_experts): route() still runs over all E, but only
// the held experts are touched; as the held range is contiguous, so are its routes' positions
// [expert_offsets[first], expert_offsets[first + L]). The combine skips the other routes and keeps
// the slot order, so a fixed shard count gives the same bits whatever the thread count.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/tensor_check.h"
#include "cpu/activation.h"
#include "cpu/thread_pool.h"
#include "qmoe/backend.h"
#include "qmoe/quantize.h"
#include "qmoe/routing.h"

namespace qmoe {
namespace cpu {
namespace {

constexpr size_t kAlign = 64;
constexpr int64_t kRowsPerTask = 16;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Dot product in fp32 with eight interleaved partial sums (a fixed order the compiler can
// vectorize without reassociating), then a fixed pairwise finish.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// One FC as the backend reads it: format, raw-layout views, logical [n, k].
struct Fc {
  FcFormat format;
  FcWeights weights;
  int64_t n = 0, k = 0;
  std::vector<uint8_t> repacked;  // FP4 weights moved from ORT's N-packed to the K-packed layout
};

class CpuLayer final : public PreparedLayer {
 public:
  CpuLayer(const LayerSpec& spec, const LayerWeights& w, int threads)
      : spec_(spec), first_expert_(spec.first_expert), router_bias_(w.router_bias), pool_(threads) {
    init_fc(&fc1_, spec.fc1, w.fc1, spec.fc1_rows(), spec.hidden);
    init_fc(&fc2_, spec.fc2, w.fc2, spec.hidden, spec.inter);
    if (spec.has_fc3()) init_fc(&fc3_, spec.fc3, w.fc3, spec.inter, spec.hidden);
  }

  BackendKind backend() const override { return BackendKind::kCpu; }
  const LayerSpec& spec() const override { return spec_; }

  // workspace_size(T) = A(route_maps_bytes(T, slots, E)) + A(4 E) + A(4 T H) + A(4 R N1)
  //                     [+ A(4 R I) with FC3] + A(4 R I) + A(4 R H) + threads * A(4 max(H, I))
  // with R = T * slots and A() rounding up to 64 bytes; 0 for T <= 0 (a call of zero tokens
  // touches no memory).
  size_t workspace_size(int64_t max_tokens) const override {
    return max_tokens > 0 ? layout(max_tokens).total : 0;
  }

  Status run(const RunInputs& in, const MutableTensorView& out, void* workspace,
             size_t workspace_bytes, void* stream, RunProfile* profile) override;

 private:
  struct Layout {
    size_t maps, touched, x, h, h3, act, y, rowbuf, rowbuf_stride, total;
  };

  Layout layout(int64_t t) const {
    const int64_t r = t * spec_.slots();
    Layout l{};
    size_t off = 0;
    auto take = [&off](size_t bytes) {
      const size_t at = off;
      off += align_up(bytes);
      return at;
    };
    l.maps = take(route_maps_bytes(t, spec_.slots(), spec_.num_experts));
    l.touched = take(4 * spec_.num_experts);
    l.x = take(4 * t * spec_.hidden);
    l.h = take(4 * r * spec_.fc1_rows());
    l.h3 = spec_.has_fc3() ? take(4 * r * spec_.inter) : 0;
    l.act = take(4 * r * spec_.inter);
    l.y = take(4 * r * spec_.hidden);
    l.rowbuf_stride = align_up(4 * std::max(spec_.hidden, spec_.inter));
    l.rowbuf = off;
    off += l.rowbuf_stride * pool_.size();
    l.total = off;
    return l;
  }

  void init_fc(Fc* fc, const FcFormat& f, const FcWeights& w, int64_t n, int64_t k) {
    fc->format = f;
    fc->weights = w;
    fc->n = n;
    fc->k = k;
    if (f.info().kind == FormatKind::kFp4 && f.fp4_layout == Fp4Layout::kNPacked) {
      // Reading a row of the N-packed layout is a strided gather; repack once, exactly.
      const int64_t experts = spec_.weight_experts();
      fc->repacked.resize(static_cast<size_t>(experts * n * k / 2));
      fp4_repack(Fp4Layout::kNPacked, static_cast<const uint8_t*>(w.weight.data), experts, n, k,
                 fc->repacked.data());
      fc->format.fp4_layout = Fp4Layout::kKPacked;
      fc->weights.weight = TensorView(fc->repacked.data(), DType::kU8, {experts, n, k / 2});
    }
  }

  // out[p * out_stride + row] = dot(W[e, row, :], in[...]) (+ bias) for every route position p
  // of every touched expert. `input_of(p)` gives the K-vector route position p reads;
  // `scale_of(p)` multiplies the dot product (routing weight for CombineMode::kScaleInput).
  template <typename InputOf, typename ScaleOf>
  void run_fc(const Fc& fc, const RouteMapsView& maps, const int32_t* touched, int64_t n_touched,
              char* rowbufs, size_t rowbuf_stride, float* out, InputOf input_of, ScaleOf scale_of) {
    const int64_t chunks = (fc.n + kRowsPerTask - 1) / kRowsPerTask;
    pool_.parallel_for(n_touched * chunks, [&](int64_t task, int worker) {
      const int e = touched[task / chunks];
      const int64_t we = e - first_expert_;  // the expert's index in the weight tensors
      const int64_t row0 = (task % chunks) * kRowsPerTask;
      const int64_t row1 = std::min(fc.n, row0 + kRowsPerTask);
      float* row = reinterpret_cast<float*>(rowbufs + worker * rowbuf_stride);
      const int32_t p0 = maps.expert_offsets[e], p1 = maps.expert_offsets[e + 1];
      const TensorView& bias = fc.weights.bias;
      for (int64_t n = row0; n < row1; ++n) {
        dequantize_row<float>(fc.format, fc.weights, fc.n, fc.k, we, n, row);
        const float b = bias.present() ? load_float(bias.data, bias.dtype, we * fc.n + n) : 0.0f;
        for (int32_t p = p0; p < p1; ++p) {
          out[p * fc.n + n] = scale_of(p) * dot(row, input_of(p), fc.k) + b;
        }
      }
    });
  }

  LayerSpec spec_;
  int64_t first_expert_ = 0;
  TensorView router_bias_;
  Fc fc1_, fc2_, fc3_;
  ThreadPool pool_;
};

Status CpuLayer::run(const RunInputs& in, const MutableTensorView& out, void* workspace,
                     size_t workspace_bytes, void* stream, RunProfile* profile) {
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(spec_, in, out, &tokens));
  if (tokens == 0) {  // nothing to read or write: workspace and data pointers are not touched
    if (profile) *profile = RunProfile{};
    return Status::ok();
  }
  const Layout l = layout(tokens);
  if (workspace == nullptr || workspace_bytes < l.total) {
    return Status::invalid("workspace: expected at least " + std::to_string(l.total) +
                           " bytes (workspace_size(" + std::to_string(tokens) + ")), got " +
                           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) {
    return Status::invalid("workspace: expected a 64-byte aligned pointer");
  }
  char* ws = static_cast<char*>(workspace);
  const int64_t H = spec_.hidden, I = spec_.inter, N1 = spec_.fc1_rows();
  const int slots = spec_.slots();
  const auto t0 = std::chrono::steady_clock::now();

  // Input to fp32, rejecting NaN/Inf with the token that carries it.
  float* x = reinterpret_cast<float*>(ws + l.x);
  for (int64_t i = 0; i < tokens * H; ++i) {
    x[i] = load_float(in.input.data, in.input.dtype, i);
    if (!std::isfinite(x[i])) {
      return Status::invalid("input: non-finite value " + std::to_string(x[i]) + " at token " +
                             std::to_string(i / H) + ", column " + std::to_string(i % H));
    }
  }

  RouteMapsView maps = carve_route_maps(ws + l.maps, tokens, slots, spec_.num_experts);
  QMOE_RETURN_IF_ERROR(route(spec_, in, router_bias_, &maps));
  int32_t* touched = reinterpret_cast<int32_t*>(ws + l.touched);
  int64_t n_touched = 0;
  const int64_t e0 = first_expert_, e1 = first_expert_ + spec_.weight_experts();
  for (int64_t e = e0; e < e1; ++e) {
    if (maps.expert_counts[e] > 0) touched[n_touched++] = static_cast<int32_t>(e);
  }
  const double route_us = micros_since(t0);

  const auto t1 = std::chrono::steady_clock::now();
  float* h = reinterpret_cast<float*>(ws + l.h);
  float* h3 = reinterpret_cast<float*>(ws + l.h3);
  float* act = reinterpret_cast<float*>(ws + l.act);
  float* y = reinterpret_cast<float*>(ws + l.y);
  char* rowbufs = ws + l.rowbuf;
  const bool scale_input = spec_.routing.combine == CombineMode::kScaleInput;
  auto token_input = [&](int32_t p) { return x + (maps.permuted_route[p] / slots) * H; };
  auto input_scale = [&](int32_t p) {
    return scale_input ? maps.weights[maps.permuted_route[p]] : 1.0f;
  };
  run_fc(fc1_, maps, touched, n_touched, rowbufs, l.rowbuf_stride, h, token_input, input_scale);
  if (spec_.has_fc3()) {
    run_fc(fc3_, maps, touched, n_touched, rowbufs, l.rowbuf_stride, h3, token_input, input_scale);
  }
  const int64_t p0 = maps.expert_offsets[e0], p1 = maps.expert_offsets[e1];  // held routes
  pool_.parallel_for(p1 - p0, [&](int64_t i, int) {
    const int64_t p = p0 + i;
    apply_activation(spec_.activation, I, h + p * N1, h3 + p * I, act + p * I);
  });
  const double fc1_us = micros_since(t1);

  const auto t2 = std::chrono::steady_clock::now();
  run_fc(
      fc2_, maps, touched, n_touched, rowbufs, l.rowbuf_stride, y,
      [&](int32_t p) { return act + p * I; }, [](int32_t) { return 1.0f; });
  const double fc2_us = micros_since(t2);

  const auto t3 = std::chrono::steady_clock::now();
  pool_.parallel_for(tokens, [&](int64_t t, int) {
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < slots; ++j) {
        const int64_t r = t * slots + j;
        if (maps.expert_ids[r] < e0 || maps.expert_ids[r] >= e1) continue;  // another shard's
        const float v = y[static_cast<int64_t>(maps.route_position[r]) * H + c];
        acc += scale_input ? v : maps.weights[r] * v;
      }
      store_float(out.data, out.dtype, t * H + c, acc);
    }
  });
  if (profile) {
    profile->route_us = route_us;
    profile->fc1_us = fc1_us;
    profile->fc2_us = fc2_us;
    profile->combine_us = micros_since(t3);
  }
  return Status::ok();
}

}  // namespace
}  // namespace cpu

const char* backend_name(BackendKind b) { return b == BackendKind::kCpu ? "cpu" : "cuda"; }

Status prepare_cpu_layer(const LayerSpec& spec, const LayerWeights& weights,
                         const PrepareOptions& options, std::unique_ptr<PreparedLayer>* out) {
  QMOE_RETURN_IF_ERROR(check_layer(spec, weights));
  if (options.num_threads < 0 || options.num_threads > 1024) {
    return Status::invalid("num_threads: expected 0 (all cores) to 1024, got " +
                           std::to_string(options.num_threads));
  }
  if (!options.act_quant.empty() && options.act_quant != "none") {
    return Status::invalid("act_quant: the CPU backend computes exactly and takes \"none\" only, got '" +
                           options.act_quant + "'");
  }
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  *out = std::make_unique<cpu::CpuLayer>(spec, weights, threads);
  return Status::ok();
}

}  // namespace qmoe

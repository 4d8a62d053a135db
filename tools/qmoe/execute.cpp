#include "execute.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "core/tensor_check.h"
#include "cuda/device_info.h"
#include "describe.h"
#include "host_buffer.h"
#include "record.h"
#include "qmoe/routing.h"

namespace qmoe::cli {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string backend_line(const ExecOptions& o) {
  if (o.backend == BackendKind::kCpu) {
    const int threads = o.threads > 0
                            ? o.threads
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return "cpu, " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s");
  }
  CudaDeviceInfo info;
  return cuda_device_info(&info) ? "cuda, " + info.name : std::string("cuda");
}

}  // namespace

// Experts that receive at least one route (shared experts always do).
Status count_touched_experts(const LayerSpec& spec, const LayerWeights& w, const RunInputs& in,
                             int64_t tokens, int64_t* touched) {
  const size_t bytes = route_maps_bytes(tokens, spec.slots(), spec.num_experts);
  AlignedBuffer buf = aligned_buffer(bytes);
  if (!buf)
    return Status::internal("route maps: cannot allocate " + std::to_string(bytes) + " bytes");
  RouteMapsView maps = carve_route_maps(buf.get(), tokens, spec.slots(), spec.num_experts);
  QMOE_RETURN_IF_ERROR(route(spec, in, w.router_bias, &maps));
  *touched = 0;
  for (int64_t e = 0; e < spec.num_experts; ++e) *touched += maps.expert_counts[e] > 0;
  return Status::ok();
}

double error_budget(DType act_dtype, BackendKind backend, bool fp8_activations) {
  const bool gpu = backend == BackendKind::kCuda;
  if (gpu && fp8_activations) return kFp8ActErrorBudget;
  switch (act_dtype) {
    case DType::kF16:
      return gpu ? 2.5e-3 : 2e-3;
    case DType::kBF16:
      return gpu ? 1e-2 : 8e-3;
    default:
      return gpu ? 2e-5 : 1e-5;
  }
}

bool fp8_calls_on(BackendKind backend, const PrepareOptions& resolved, const std::string& path) {
  return backend == BackendKind::kCuda && path == "generic" && resolved.act_quant == "fp8_e4m3";
}

Status time_runs(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                 int repeat, TimedRuns* runs) {
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(layer.spec(), in, out, &tokens));
  const size_t bytes = layer.workspace_size(tokens);
  AlignedBuffer ws = aligned_buffer(bytes);
  if (!ws)
    return Status::internal("workspace: cannot allocate " + std::to_string(bytes) + " bytes");
  QMOE_RETURN_IF_ERROR(layer.run(in, out, ws.get(), bytes, nullptr, nullptr));
  for (int r = 0; r < repeat; ++r) {
    RunProfile p;
    const Clock::time_point t0 = Clock::now();
    QMOE_RETURN_IF_ERROR(layer.run(in, out, ws.get(), bytes, nullptr, &p));
    runs->ms.push_back(ms_since(t0));
    runs->profiles.push_back(p);
  }
  return Status::ok();
}

Status execute_and_report(const LayerSpec& spec, const LayerWeights& weights,
                          const RunInputs& inputs, const ExecOptions& options,
                          std::vector<uint8_t>* output, MutableTensorView* output_view,
                          bool* check_failed) {
  *check_failed = false;
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_inputs(spec, inputs, &tokens));
  output->assign(inputs.input.bytes(), 0);
  MutableTensorView out;
  out.data = output->data();
  out.dtype = inputs.input.dtype;
  out.rank = inputs.input.rank;
  std::copy(inputs.input.dims, inputs.input.dims + kMaxRank, out.dims);
  *output_view = out;

  PrepareOptions po;
  po.num_threads = options.threads;
  QMOE_RETURN_IF_ERROR(resolve_prepare_options(po, &po));  // once: the check's budget reads it
  std::unique_ptr<PreparedLayer> layer;
  Clock::time_point t0 = Clock::now();
  {
    StepNote note("preparing the layer");
    QMOE_RETURN_IF_ERROR(prepare_layer(options.backend, spec, weights, po, &layer));
  }
  const double prepare_ms = ms_since(t0);

  TimedRuns runs;
#ifdef QMOE_WITH_CUDA
  if (options.backend == BackendKind::kCuda) {
    QMOE_RETURN_IF_ERROR(time_cuda_runs(*layer, inputs, out, options.repeat, &runs));
  } else {
    QMOE_RETURN_IF_ERROR(time_runs(*layer, inputs, out, options.repeat, &runs));
  }
#else
  QMOE_RETURN_IF_ERROR(time_runs(*layer, inputs, out, options.repeat, &runs));
#endif
  int64_t touched = 0;
  QMOE_RETURN_IF_ERROR(count_touched_experts(spec, weights, inputs, tokens, &touched));

  const double med = median(runs.ms);
  auto stage = [&](double RunProfile::*f) {
    std::vector<double> v;
    for (const RunProfile& p : runs.profiles) v.push_back(p.*f / 1000.0);
    return median(v);
  };
  const double weight_bytes =
      static_cast<double>(touched) * static_cast<double>(expert_bytes(spec));
  const double seconds = med * 1e-3;
  std::printf("%-10s %s\n", "format",
              (describe_formats(spec) + "; activations " + dtype_name(spec.act_dtype)).c_str());
  std::printf("%-10s %s\n", "backend", backend_line(options).c_str());
  std::printf("%-10s median %.3f ms over %d runs (min %.3f, max %.3f); prepare %.1f ms\n", "time",
              med, options.repeat, *std::min_element(runs.ms.begin(), runs.ms.end()),
              *std::max_element(runs.ms.begin(), runs.ms.end()), prepare_ms);
  std::printf("%-10s route %.3f ms, fc1 %.3f ms, fc2 %.3f ms, combine %.3f ms (%s)\n", "stages",
              stage(&RunProfile::route_us), stage(&RunProfile::fc1_us), stage(&RunProfile::fc2_us),
              stage(&RunProfile::combine_us),
              options.backend == BackendKind::kCuda ? "CUDA events" : "host clock");
  std::printf("%-10s %lld of %lld experts touched, %.2f MB (%.3f MB per expert)\n", "weights",
              static_cast<long long>(touched), static_cast<long long>(spec.num_experts),
              weight_bytes / 1e6, static_cast<double>(expert_bytes(spec)) / 1e6);
  std::printf("%-10s %.2f GB/s of weights, %.3f TFLOP/s\n", "rate", weight_bytes / seconds / 1e9,
              layer_flops(spec, tokens) / seconds / 1e12);

  if (!options.check) {
    std::printf("%-10s skipped (--no-check)\n", "check");
    return Status::ok();
  }
  t0 = Clock::now();
  std::vector<double> ref;
  {
    StepNote note("the fp64 oracle");
    QMOE_RETURN_IF_ERROR(reference_forward(spec, weights, inputs, &ref));
  }
  const double oracle_ms = ms_since(t0);
  std::vector<double> got(ref.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = load_float(out.data, out.dtype, i);
  const double err = relative_norm_error(got.data(), ref.data(), ref.size());
  const double budget = error_budget(
      out.dtype, options.backend, fp8_calls_on(options.backend, po, layer->dispatch_choice(tokens)));
  *check_failed = !(err <= budget);
  std::printf(
      "%-10s rel-norm error %.3e vs the fp64 oracle, budget %.0e (%s): %s (oracle %.0f ms)\n",
      "check", err, budget, dtype_name(out.dtype), *check_failed ? "FAIL" : "PASS", oracle_ms);
  return Status::ok();
}

}  // namespace qmoe::cli

// Runs a layer on a backend: prepare, one warm-up call, `repeat` timed calls, then the routing
// statistics (experts touched, bytes, FLOPs) and the check against the fp64 oracle. Prints a
// report.
#pragma once

#include <cstdint>
#include <vector>

#include "qmoe/backend.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe::cli {

struct ExecOptions {
  BackendKind backend = BackendKind::kCpu;
  int threads = 0;  // 0: hardware concurrency
  int repeat = 5;
  bool check = true;
};

// Wall-clock and per-stage times of each timed call.
struct TimedRuns {
  std::vector<double> ms;
  std::vector<RunProfile> profiles;
};

// Runs the prepared layer once to warm up, then `repeat` times, reading and writing host memory
// (the CUDA path stages the tensors on the device). out receives the last call's output.
Status time_runs(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                 int repeat, TimedRuns* runs);
#ifdef QMOE_WITH_CUDA
Status time_cuda_runs(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                      int repeat, TimedRuns* runs);
#endif

// Experts that receive at least one route of `in` (the host routing, which every backend matches
// bit for bit; shared experts always count).
Status count_touched_experts(const LayerSpec& spec, const LayerWeights& w, const RunInputs& in,
                             int64_t tokens, int64_t* touched);

// The relative-norm error allowed against the oracle for an activation dtype. CPU: f32 1e-5, f16
// 2e-3, bf16 8e-3 (the output's rounding dominates). CUDA (weights and the activation rounded to
// the dtype for the tensor cores, docs/cuda-backend.md): f32 2e-5, f16 2.5e-3, bf16 1e-2; a call
// the FP8 activations took (fp8_calls_on: $QMOE_ACT_QUANT=fp8_e4m3, the generic path):
// kFp8ActErrorBudget.
double error_budget(DType act_dtype, BackendKind backend, bool fp8_activations = false);

// Whether a CUDA call on `path` (PreparedLayer::dispatch_choice) ran FP8 activations: the options
// the layer was prepared with, already resolved (the environment is the CLI's only way to set
// act_quant), ask for them and the call took the generic path, the one they apply to.
bool fp8_calls_on(BackendKind backend, const PrepareOptions& resolved, const std::string& path);

// Everything `qmoe run` does after it has a layer and inputs. output receives the bytes of the
// output tensor (the input's dtype and shape). *check_failed is set when the error exceeds the
// budget. Errors are returned; the report goes to stdout.
Status execute_and_report(const LayerSpec& spec, const LayerWeights& weights,
                          const RunInputs& inputs, const ExecOptions& options,
                          std::vector<uint8_t>* output, MutableTensorView* output_view,
                          bool* check_failed);

}  // namespace qmoe::cli

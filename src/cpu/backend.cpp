// Backend selection and the convenience entry points shared by every backend.
#include "qmoe/backend.h"

#include <cmath>
#include <cstdlib>
#include <memory>

#include "cuda/cuda_backend.h"

namespace qmoe {

Status prepare_cpu_layer(const LayerSpec& spec, const LayerWeights& weights,
                         const PrepareOptions& options, std::unique_ptr<PreparedLayer>* out);

bool backend_available(BackendKind b) {
  if (b == BackendKind::kCpu) return true;
  return cuda_backend_available();
}

Status prepare_layer(BackendKind backend, const LayerSpec& spec, const LayerWeights& weights,
                     const PrepareOptions& options, std::unique_ptr<PreparedLayer>* out) {
  if (out == nullptr) return Status::invalid("out: expected a non-null pointer");
  switch (backend) {
    case BackendKind::kCpu:
      return prepare_cpu_layer(spec, weights, options, out);
    case BackendKind::kCuda:
      return prepare_cuda_layer(spec, weights, options, out);
  }
  return Status::invalid("backend: unknown value " + std::to_string(static_cast<int>(backend)));
}

Status run_layer(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                 RunProfile* profile) {
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(layer.spec(), in, out, &tokens));
  const size_t bytes = layer.workspace_size(tokens);
  // 64-byte alignment: allocate in units of 64 bytes.
  struct alignas(64) Line {
    char b[64];
  };
  std::unique_ptr<Line[]> ws(new (std::nothrow) Line[bytes / 64 + 1]);
  if (!ws) return Status::invalid("workspace: cannot allocate " + std::to_string(bytes) + " bytes");
  return layer.run(in, out, ws.get(), bytes, nullptr, profile);
}

double relative_norm_error(const double* a, const double* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

}  // namespace qmoe

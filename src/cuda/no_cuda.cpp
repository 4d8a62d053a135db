// Built when qmoe is configured without CUDA: the CUDA backend reports itself absent.
#include "cuda/cuda_backend.h"
#include "cuda/device_info.h"

namespace qmoe {

bool cuda_device_info(CudaDeviceInfo* info) { return false; }

bool cuda_backend_available(std::string* why_not) {
  if (why_not) *why_not = "this build has no CUDA backend (configured with QMOE_CUDA=OFF)";
  return false;
}

Status prepare_cuda_layer(const LayerSpec&, const LayerWeights&, const PrepareOptions&,
                          std::unique_ptr<PreparedLayer>*) {
  return Status::unsupported("backend cuda: this build has no CUDA backend (QMOE_CUDA=OFF)");
}

}  // namespace qmoe

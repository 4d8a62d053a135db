// CUDA error handling for the CUDA backend: every runtime call becomes a Status naming what failed;
// nothing aborts. Kernel launches are checked with cudaGetLastError right after the launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "qmoe/status.h"

namespace qmoe::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return Status::internal(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                          cudaGetErrorString(e) + ")");
}

}  // namespace qmoe::cuda

// Returns a Status from the enclosing function when a CUDA runtime call fails.
#define QMOE_CUDA_TRY(expr) QMOE_RETURN_IF_ERROR(::qmoe::cuda::cuda_status((expr), #expr))

// After a <<<...>>> launch: a bad configuration surfaces here, not at the next synchronization.
#define QMOE_CUDA_CHECK_LAUNCH(name) \
  QMOE_RETURN_IF_ERROR(::qmoe::cuda::cuda_status(cudaGetLastError(), "launch of " name))

// Entry points of the CUDA backend, defined by src/cuda/layer/ in CUDA builds and by
// src/cuda/no_cuda.cpp otherwise.
#pragma once

#include <memory>
#include <string>

#include "qmoe/backend.h"

namespace qmoe {

// True when this build has the CUDA backend and device 0 can run it (sm_90).
bool cuda_backend_available(std::string* why_not = nullptr);

Status prepare_cuda_layer(const LayerSpec& spec, const LayerWeights& weights,
                          const PrepareOptions& options, std::unique_ptr<PreparedLayer>* out);

}  // namespace qmoe

// Device loads of narrow scalars decoded exactly to fp32 (the host's num:: conversions). Stores
// use tensor_check.h's store_float, which host and device share.
#pragma once

#include <cstdint>

#include "core/numeric.h"
#include "core/tensor_check.h"
#include "qmoe/tensor.h"

namespace qmoe::cuda {

// Element i of a tensor of dtype t (f32, f16, bf16, f8e4m3 or f8e8m0), decoded exactly.
__device__ __forceinline__ float load_scalar(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF16:
      return num::f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16:
      return num::bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF8E4M3:
      return num::e4m3_to_f32(static_cast<const uint8_t*>(p)[i]);
    case DType::kF8E8M0:
      return num::e8m0_to_f32(static_cast<const uint8_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

}  // namespace qmoe::cuda

// qmoe: shared tensor checks and element reads used by validation and the CPU code.
#pragma once

#include <cstdint>
#include <string>

#include "core/numeric.h"
#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe {

// Float8 tensors may arrive typed as raw bytes (ORT's uint8 inputs); both spellings are accepted.
inline bool dtype_matches(DType got, DType want) {
  if (got == want) return true;
  const bool want_byte = want == DType::kF8E4M3 || want == DType::kF8E8M0 || want == DType::kU8;
  return want_byte && (got == DType::kU8 || got == want);
}

// Given (TensorView::given(): present, or empty with a shape), of dtype `dtype` and shape
// dims[0..rank).
Status expect_tensor(const TensorView& v, const std::string& name, DType dtype, const int64_t* dims,
                     int rank);

// No NaN or infinity (f32, f16, bf16, f8e4m3, f8e8m0; other dtypes pass).
Status expect_finite(const TensorView& v, const std::string& name);

// Element i of an f32/f16/bf16/f64 tensor as float.
inline float load_float(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return num::f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return num::bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF64:
      return static_cast<float>(static_cast<const double*>(data)[i]);
    default:
      return 0.0f;
  }
}

// Stores v into element i of an f32/f16/bf16 tensor (rounding to nearest even). Host and device:
// the CUDA kernels store their outputs with it too.
QMOE_HD void store_float(void* data, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(data)[i] = num::f32_to_f16(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[i] = num::f32_to_bf16(v);
      break;
    default:
      break;
  }
}

}  // namespace qmoe

#include "core/tensor_check.h"

#include <cmath>

namespace qmoe {

Status expect_tensor(const TensorView& v, const std::string& name, DType dtype, const int64_t* dims,
                     int rank) {
  const std::string want = std::string(dtype_name(dtype)) + " " + shape_string(dims, rank);
  if (!v.given()) return Status::invalid(name + ": missing, expected " + want);
  bool same = v.rank == rank;
  for (int i = 0; same && i < rank; ++i) same = v.dims[i] == dims[i];
  if (!same || !dtype_matches(v.dtype, dtype)) {
    return Status::invalid(name + ": expected " + want + ", got " + dtype_name(v.dtype) + " " +
                           v.shape_string());
  }
  return Status::ok();
}

Status expect_finite(const TensorView& v, const std::string& name) {
  if (!v.present()) return Status::ok();
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    float x;
    switch (v.dtype) {
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
      case DType::kF64:
        x = load_float(v.data, v.dtype, i);
        break;
      case DType::kF8E4M3:
        x = num::e4m3_to_f32(static_cast<const uint8_t*>(v.data)[i]);
        break;
      case DType::kF8E8M0:
        x = num::e8m0_to_f32(static_cast<const uint8_t*>(v.data)[i]);
        break;
      default:
        return Status::ok();
    }
    if (!std::isfinite(x)) {
      return Status::invalid(name + ": non-finite value " + std::to_string(x) + " at flat index " +
                             std::to_string(i));
    }
  }
  return Status::ok();
}

}  // namespace qmoe

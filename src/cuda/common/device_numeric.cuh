// Device loads of narrow scalars decoded exactly to fp32 (the host's num:: conversions). Stores
// use tensor_check.h's store_float, which host and device share.
#pragma once

#include <cstdint>

#include "core/numeric.h"
#include "core/tensor_check.h"
#include "qmoe/tensor.h"

namespace qmoe::cuda {

// The two 16-bit floats of a word (the first in the low half), bf16 or f16, as fp32.
__device__ __forceinline__ float2 word16_to_f32(uint32_t w, bool bf16) {
  float2 r;
  r.x = bf16 ? num::bf16_to_f32(static_cast<uint16_t>(w & 0xFFFFu))
             : num::f16_to_f32(static_cast<uint16_t>(w & 0xFFFFu));
  r.y = bf16 ? num::bf16_to_f32(static_cast<uint16_t>(w >> 16))
             : num::f16_to_f32(static_cast<uint16_t>(w >> 16));
  return r;
}

// The four 16-bit floats of two words (one 8-byte load; the first in w.x's low half) as fp32.
__device__ __forceinline__ void words16x4_to_f32(uint2 w, bool bf16, float (&v)[4]) {
  const float2 x = word16_to_f32(w.x, bf16), y = word16_to_f32(w.y, bf16);
  v[0] = x.x, v[1] = x.y, v[2] = y.x, v[3] = y.y;
}

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

// Inf and nan in 16-bit floats: f16 and bf16 both mark them with an all-ones exponent field.
__host__ __device__ constexpr uint32_t exp_mask16(bool bf16) {
  return bf16 ? 0x7F80u : 0x7C00u;
}
// Whether the 16-bit float in the low half of `bits` is inf or nan.
__device__ __forceinline__ bool nonfinite16(uint32_t bits, bool bf16) {
  const uint32_t m = exp_mask16(bf16);
  return (bits & m) == m;
}
// Whether either 16-bit float of a word (two packed elements) is inf or nan.
__device__ __forceinline__ bool nonfinite16x2(uint32_t word, bool bf16) {
  return nonfinite16(word, bf16) || nonfinite16(word >> 16, bf16);
}
// Whether any of 16 bytes' eight 16-bit floats is inf or nan.
__device__ __forceinline__ bool nonfinite16x8(uint4 v, bool bf16) {
  return nonfinite16x2(v.x, bf16) || nonfinite16x2(v.y, bf16) || nonfinite16x2(v.z, bf16) ||
         nonfinite16x2(v.w, bf16);
}

}  // namespace qmoe::cuda

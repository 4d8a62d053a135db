// The decode kernel's prologue (decode_kernel.cuh): a block's tiles' scales and zero points
// staged into shared memory as fp32 (FP4: NVFP4's 16-bit multipliers beside them), read in batches
// of 16-byte loads while the block's first weight chunks are in flight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/common/device_numeric.cuh"
#include "cuda/decode/decode_common.cuh"
#include "cuda/decode/decode_gemv.h"
#include "cuda/decode/decode_launch.h"

namespace qmoe::cuda::decode_detail {

// Copies the block's tiles' scales (tile-ordered, mma_pack_scales) into shared memory as fp32, and
// the zero points likewise: a run of n entries from entry `first`, with 16-byte loads (a tile's
// run is a multiple of 16 entries and 16-byte aligned).
__device__ __forceinline__ void copy_scales(const DecodeFcArgs& a, int64_t first, int n, float* sc,
                                            float* zs, int tid) {
#if defined(QMOE_DECODE_ABLATE_SCALAR_SCALES)
  for (int i = tid; i < n; i += kWarps * 32) {  // one entry per load
    sc[i] = load_scalar(a.scales, a.scale_dtype, first + i);
    if (a.zero_points != nullptr) {
      zs[i] = static_cast<float>(static_cast<const uint8_t*>(a.zero_points)[first + i]);
    }
  }
  return;
#endif
  if (a.scale_dtype == DType::kF32) {
    const uint4* src = reinterpret_cast<const uint4*>(a.scales) + first / 4;
#pragma unroll 2
    for (int i = tid; i < n / 4; i += kWarps * 32) {
      reinterpret_cast<uint4*>(sc)[i] = __ldg(src + i);
    }
  } else {
    const bool bf16 = a.scale_dtype == DType::kBF16;
    const uint4* src = reinterpret_cast<const uint4*>(a.scales) + first / 8;
#pragma unroll 2
    for (int i = tid; i < n / 8; i += kWarps * 32) {
      const uint4 v = __ldg(src + i);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      float f[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint16_t h = static_cast<uint16_t>(w[j / 2] >> (16 * (j % 2)));
        f[j] = bf16 ? __uint_as_float(static_cast<uint32_t>(h) << 16)
                    : __half2float(__ushort_as_half(h));
      }
      reinterpret_cast<float4*>(sc)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
      reinterpret_cast<float4*>(sc)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
  }
  if (a.zero_points == nullptr) return;
  const uint4* zsrc = reinterpret_cast<const uint4*>(a.zero_points) + first / 16;
  for (int i = tid; i < n / 16; i += kWarps * 32) {
    const uint4 v = __ldg(zsrc + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      reinterpret_cast<float4*>(zs)[4 * i + j] =
          make_float4(static_cast<float>(w[j] & 0xFFu), static_cast<float>((w[j] >> 8) & 0xFFu),
                      static_cast<float>((w[j] >> 16) & 0xFFu), static_cast<float>(w[j] >> 24));
    }
  }
}

// FP4: the block's tiles' scales into shared memory. NVFP4: every row's fp32 scale is the expert's
// global scale times 2^c (nbp is 1), and the e4m3 block scales (tile order, mblk per row) become
// 16-bit multipliers (nvfp4_multiplier): a cvt turns two into an f16x2, times 2^(14 - c) for f16
// or, through fp32, 2^(126 - c) for bf16, every step exact. MXFP4: e8m0 * global as fp32 per
// 32-K block, as the integer formats' scales.
template <int kCode, bool kBf16>
__device__ __forceinline__ void copy_fp4_scales(const DecodeFcArgs& a, int64_t e, int m0, int ntl,
                                                int nbp, int mblk, float* sc, uint16_t* msm,
                                                int tid) {
  const MmaPackShape& s = a.shape;
  const float g = a.global[e];
  if constexpr (kCode == static_cast<int>(MmaCodes::kNvFp4)) {
    constexpr float kRowFactor = exp2_int(nvfp4_mult_shift(kBf16));
    const float row_scale = g * kRowFactor;
    for (int i = tid; i < ntl * 16; i += kWarps * 32) sc[i] = row_scale;
    const uint4* src = reinterpret_cast<const uint4*>(a.scales + (e * s.tiles + m0) * 16 * mblk);
    for (int i = tid; i < ntl * mblk; i += kWarps * 32) {  // 16 scales per load
      const uint4 v = __ldg(src + i);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint32_t o[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>(w[j / 2] >> (16 * (j % 2))), __NV_E4M3);
        const __half2 h = *reinterpret_cast<const __half2*>(&hr);
        if constexpr (kBf16) {
          const float2 f = __half22float2(h);
          constexpr float kFactor = nvfp4_mult_factor(true);
          const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * kFactor, f.y * kFactor);
          o[j] = *reinterpret_cast<const uint32_t*>(&b);
        } else {
          constexpr float kFactor = nvfp4_mult_factor(false);
          const __half2 m = __hmul2(h, __float2half2_rn(kFactor));
          o[j] = *reinterpret_cast<const uint32_t*>(&m);
        }
      }
      reinterpret_cast<uint4*>(msm)[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
      reinterpret_cast<uint4*>(msm)[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
  } else {
    const uint4* src = reinterpret_cast<const uint4*>(a.scales + (e * s.tiles + m0) * 16 * nbp);
    for (int i = tid; i < ntl * nbp; i += kWarps * 32) {  // 16 scales per load
      const uint4 v = __ldg(src + i);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float f[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) f[b] = num::e8m0_to_f32((w[j] >> (8 * b)) & 0xFFu) * g;
        reinterpret_cast<float4*>(sc)[4 * i + j] = make_float4(f[0], f[1], f[2], f[3]);
      }
    }
  }
}

}  // namespace qmoe::cuda::decode_detail

// The weighted combine of a token's FC2 outputs: the finalize kernel's arithmetic (the fused
// decode kernel's combine adds in the same order, fused_decode_kernel.cuh).
#pragma once

#include <cstdint>

#include "cuda/common/device_numeric.cuh"
#include "cuda/layer/stages.h"

namespace qmoe::cuda {

// Four or one values of a y row as fp32 (Y = float, or uint16_t for bf16 bits), read through L2.
__device__ __forceinline__ void load_y(const float* y, float (&v)[4]) {
  const float4 x = __ldcg(reinterpret_cast<const float4*>(y));
  v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
}
__device__ __forceinline__ void load_y(const uint16_t* y, float (&v)[4]) {
  words16x4_to_f32(__ldcg(reinterpret_cast<const uint2*>(y)), true, v);
}
__device__ __forceinline__ void load_y(const float* y, float (&v)[1]) { v[0] = __ldcg(y); }
__device__ __forceinline__ void load_y(const uint16_t* y, float (&v)[1]) {
  v[0] = num::bf16_to_f32(__ldcg(reinterpret_cast<const unsigned short*>(y)));
}

// Columns c .. c + kCols - 1 of one token (kCols 1 or 4; for 4, c a multiple of 4 and y's rows
// 16-byte aligned for f32, 8-byte for bf16), into acc: for each column the sum over its held
// slots j (expert in [expert_begin, expert_end)), in slot order, in fp32, of w_j * (y[pos_j, c] +
// b2[e_j - expert_begin, c]) (without w_j for kScaleInput); another shard's slots are skipped, as
// the CPU backend skips them. pos, expert and w are the token's slots. Y is y's element: float, or
// uint16_t for bf16 rows (FinalizeArgs::y_dtype). y is read through L2 (ld.global.cg), so a
// kernel may combine what its other blocks wrote. A column's terms and their order do not depend
// on kCols, so neither do its bits.
template <int kCols, typename Y = float>
__device__ __forceinline__ void combine_columns(const FinalizeArgs& a, const int32_t* pos,
                                                const int32_t* expert, const float* w, int64_t c,
                                                float (&acc)[kCols]) {
  static_assert(kCols == 1 || kCols == 4, "one column, or four in one load");
#pragma unroll
  for (int q = 0; q < kCols; ++q) acc[q] = 0.0f;
  for (int j0 = 0; j0 < a.slots; j0 += 4) {
    float v[4][kCols];
    bool held[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // four loads in flight, then the adds in order
      const int j = j0 + u;
      held[u] = j < a.slots && expert[j] >= a.expert_begin && expert[j] < a.expert_end;
      if (held[u]) {
        load_y(static_cast<const Y*>(a.y) + static_cast<int64_t>(pos[j]) * a.ldy + c, v[u]);
      } else {
#pragma unroll
        for (int q = 0; q < kCols; ++q) v[u][q] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u;
      if (!held[u]) continue;
#pragma unroll
      for (int q = 0; q < kCols; ++q) {
        float x = v[u][q];
        if (a.fc2_bias) {
          const int64_t e = expert[j] - a.expert_begin;
          x = x + load_scalar(a.fc2_bias, a.bias_dtype, e * a.hidden + c + q);
        }
        acc[q] = a.scale_input ? acc[q] + x : acc[q] + w[j] * x;
      }
    }
  }
}

}  // namespace qmoe::cuda

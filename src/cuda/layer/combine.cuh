// The weighted combine of a token's FC2 outputs: the finalize kernel's arithmetic, in a header so
// that any kernel which combines gives the same bits.
#pragma once

#include <cstdint>

#include "cuda/common/device_numeric.cuh"
#include "cuda/layer/stages.h"

namespace qmoe::cuda {

// Columns c .. c + kCols - 1 of one token (kCols 1 or 4; for 4, c a multiple of 4 and y's rows
// 16-byte aligned), into acc: for each column the sum over its held slots j (expert in
// [expert_begin, expert_end)), in slot order, in fp32, of w_j * (y[pos_j, c] + b2[e_j -
// expert_begin, c]) (without w_j for kScaleInput); another shard's slots are skipped, as the CPU
// backend skips them. pos, expert and w are the token's slots. y is read through L2
// (ld.global.cg), so a kernel may combine what its other blocks wrote. A column's terms and their
// order do not depend on kCols, so neither do its bits.
template <int kCols>
__device__ __forceinline__ void combine_columns(const FinalizeArgs& a, const int32_t* pos,
                                                const int32_t* expert, const float* w, int64_t c,
                                                float (&acc)[kCols]) {
  static_assert(kCols == 1 || kCols == 4, "one column, or four in a 16-byte load");
#pragma unroll
  for (int q = 0; q < kCols; ++q) acc[q] = 0.0f;
  for (int j0 = 0; j0 < a.slots; j0 += 4) {
    float v[4][kCols];
    bool held[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // four loads in flight, then the adds in order
      const int j = j0 + u;
      held[u] = j < a.slots && expert[j] >= a.expert_begin && expert[j] < a.expert_end;
      const float* y = a.y + static_cast<int64_t>(held[u] ? pos[j] : 0) * a.ldy + c;
      if constexpr (kCols == 4) {
        const float4 x = held[u] ? __ldcg(reinterpret_cast<const float4*>(y))
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[u][0] = x.x, v[u][1] = x.y, v[u][2] = x.z, v[u][3] = x.w;
      } else {
        v[u][0] = held[u] ? __ldcg(y) : 0.0f;
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

// One column (the fused decode kernel's combine).
__device__ __forceinline__ float combine_column(const FinalizeArgs& a, const int32_t* pos,
                                                const int32_t* expert, const float* w, int64_t c) {
  float acc[1];
  combine_columns<1>(a, pos, expert, w, c, acc);
  return acc[0];
}

}  // namespace qmoe::cuda

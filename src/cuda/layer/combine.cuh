// The weighted combine of a token's FC2 outputs: the finalize kernel's arithmetic, in a header so
// that any kernel which combines gives the same bits.
#pragma once

#include <cstdint>

#include "cuda/common/device_numeric.cuh"
#include "cuda/layer/stages.h"

namespace qmoe::cuda {

// Column c of one token: sum over its held slots j (expert in [expert_begin, expert_end)), in slot
// order, in fp32, of w_j * (y[pos_j, c] + b2[e_j - expert_begin, c]) (without w_j for
// kScaleInput); another shard's slots are skipped, as the CPU backend skips them. pos, expert and
// w are the token's slots. y is read through L2 (ld.global.cg), so a kernel may combine what its
// other blocks wrote.
__device__ __forceinline__ float combine_column(const FinalizeArgs& a, const int32_t* pos,
                                                const int32_t* expert, const float* w, int64_t c) {
  float acc = 0.0f;
  for (int j0 = 0; j0 < a.slots; j0 += 4) {
    float v[4];
    bool held[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // four loads in flight, then the adds in order
      const int j = j0 + u;
      held[u] = j < a.slots && expert[j] >= a.expert_begin && expert[j] < a.expert_end;
      v[u] = held[u] ? __ldcg(a.y + static_cast<int64_t>(pos[j]) * a.ldy + c) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u;
      if (held[u]) {
        float x = v[u];
        if (a.fc2_bias) {
          const int64_t e = expert[j] - a.expert_begin;
          x = x + load_scalar(a.fc2_bias, a.bias_dtype, e * a.hidden + c);
        }
        acc = a.scale_input ? acc + x : acc + w[j] * x;
      }
    }
  }
  return acc;
}

// Columns c .. c + 3 of one token (c a multiple of 4, y's rows 16-byte aligned): each column's
// sum exactly as combine_column computes it (the same terms in the same order), with one 16-byte
// load per slot.
__device__ __forceinline__ float4 combine_columns4(const FinalizeArgs& a, const int32_t* pos,
                                                   const int32_t* expert, const float* w,
                                                   int64_t c) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int j0 = 0; j0 < a.slots; j0 += 4) {
    float4 v[4];
    bool held[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {  // four loads in flight, then the adds in order
      const int j = j0 + u;
      held[u] = j < a.slots && expert[j] >= a.expert_begin && expert[j] < a.expert_end;
      v[u] = held[u] ? __ldcg(reinterpret_cast<const float4*>(
                           a.y + static_cast<int64_t>(pos[j]) * a.ldy + c))
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int j = j0 + u;
      if (!held[u]) continue;
      const float xs[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float x = xs[q];
        if (a.fc2_bias) {
          const int64_t e = expert[j] - a.expert_begin;
          x = x + load_scalar(a.fc2_bias, a.bias_dtype, e * a.hidden + c + q);
        }
        acc[q] = a.scale_input ? acc[q] + x : acc[q] + w[j] * x;
      }
    }
  }
  return make_float4(acc[0], acc[1], acc[2], acc[3]);
}

}  // namespace qmoe::cuda

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

// The finalize kernel's sum for kCols columns of one token, in one place for every kernel that
// must give its bits (the finalize kernel here, FC2's combine in decode_common.cuh): for each
// column, over the slots j < slots in slot order, skipping those of another shard (rows.local(j)
// < 0), in fp32, acc += w_j (y_j + b2[e_j]) (acc += y_j + b2[e_j] for kScaleInput), the bias
// term only where rows.has_bias(). Rows supplies the terms:
//   int   local(j)           slot j's expert as a local index, or -1 where another shard's
//   void  load(j, v[kCols])  slot j's y values of the columns
//   float bias(e, q)         b2[e] of column q
//   float weight(j)          w_j
// kAhead slots' loads go out before their adds (4 for rows in global memory, 1 in shared memory,
// where the unrolled batches only lengthen the code); a column's terms and their order depend
// neither on kCols, nor on kAhead, nor on where the rows come from, so neither do its bits.
template <int kCols, int kAhead, typename Rows>
__device__ __forceinline__ void combine_slots(int slots, bool scale_input, bool has_bias,
                                              const Rows& rows, float (&acc)[kCols]) {
#pragma unroll
  for (int q = 0; q < kCols; ++q) acc[q] = 0.0f;
  for (int j0 = 0; j0 < slots; j0 += kAhead) {
    float v[kAhead][kCols];
    int e[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      const int j = j0 + u;
      e[u] = j < slots ? rows.local(j) : -1;
      if (e[u] >= 0) {
        rows.load(j, v[u]);
      } else {
#pragma unroll
        for (int q = 0; q < kCols; ++q) v[u][q] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (e[u] < 0) continue;
#pragma unroll
      for (int q = 0; q < kCols; ++q) {
        float x = v[u][q];
        if (has_bias) x = x + rows.bias(e[u], q);
        acc[q] = scale_input ? acc[q] + x : acc[q] + rows.weight(j0 + u) * x;
      }
    }
  }
}

// Columns c .. c + kCols - 1 of one token (kCols 1 or 4; for 4, c a multiple of 4 and y's rows
// 16-byte aligned for f32, 8-byte for bf16), into acc: combine_slots over the token's slots (pos,
// expert, w), y_j = y[pos_j, c], the held experts [expert_begin, expert_end). Y is y's element:
// float, or uint16_t for bf16 rows (FinalizeArgs::y_dtype). y is read through L2
// (ld.global.cg), so a kernel may combine what its other blocks wrote.
template <int kCols, typename Y = float>
__device__ __forceinline__ void combine_columns(const FinalizeArgs& a, const int32_t* pos,
                                                const int32_t* expert, const float* w, int64_t c,
                                                float (&acc)[kCols]) {
  static_assert(kCols == 1 || kCols == 4, "one column, or four in one load");
  struct Rows {
    const FinalizeArgs& a;
    const int32_t* pos;
    const int32_t* expert;
    const float* w;
    int64_t c;
    __device__ int local(int j) const {
      const CombineTerms& m = a.terms;
      return expert[j] >= m.expert_begin && expert[j] < m.expert_end ? expert[j] - m.expert_begin
                                                                     : -1;
    }
    __device__ void load(int j, float (&v)[kCols]) const {
      load_y(static_cast<const Y*>(a.y) + static_cast<int64_t>(pos[j]) * a.ldy + c, v);
    }
    __device__ float bias(int e, int q) const {
      return load_scalar(a.terms.bias, a.terms.bias_dtype,
                         static_cast<int64_t>(e) * a.terms.hidden + c + q);
    }
    __device__ float weight(int j) const { return w[j]; }
  };
  combine_slots<kCols, 4>(a.terms.slots, a.terms.scale_input, a.terms.bias != nullptr,
                          Rows{a, pos, expert, w, c}, acc);
}

}  // namespace qmoe::cuda

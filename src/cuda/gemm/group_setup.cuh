// The device side of group_setup.h: one slot's writes, shared by the setup kernel and the blocked
// routing's offsets kernel, so that both write the same bytes.
#pragma once

#include "cuda/gemm/group_setup.h"

namespace qmoe::cuda {

__device__ __forceinline__ void write_group_slot(const GroupSetup& g, int j, int64_t e,
                                                 int64_t row0, int32_t rows) {
  int32_t* shape = g.shapes + 3 * static_cast<int64_t>(j);
  shape[0] = g.n;
  shape[1] = rows;
  shape[2] = g.k;
  g.ptr_a[j] = g.a + e * g.a_expert;
  g.ptr_b[j] = g.b + row0 * g.b_row;
  g.ptr_d[j] = g.d + row0 * g.d_row;
  g.ptr_s[j] = g.s + e * g.s_expert;
  g.ptr_z[j] = g.z == nullptr ? nullptr : g.z + e * g.z_expert;
#pragma unroll
  for (int i = 0; i < GroupSetup::kConsts; ++i) {
    const GroupConst& c = g.consts[i];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      if (w < c.words) c.at[static_cast<int64_t>(j) * c.words + w] = c.value[w];
    }
  }
}

}  // namespace qmoe::cuda

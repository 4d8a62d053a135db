// The plan's stores (stages.h launch_plan's layout), shared by the three kernels that build it:
// the plan kernel (stages.cu), the fused routing kernel and the blocked routing's offsets kernel.
// Each gives every expert e of the plan's `experts` its count and, from a scan over the experts
// before it, how many of them are touched (i) and their tiles (t):
//
//   touched     [e0 e1 ... e(n-1) | -1 ... -1]    touched experts ascending, then -1 to entry
//                                                 experts - 1 (an untouched e fills entry
//                                                 experts - 1 - (e - i), from the end)
//   tile_start  [t0 t1 ... t(n-1) T]              each touched expert's first tile, then the total
//   n_touched   n
//   ready       [0 ... 0]                         where set: the FC1 -> FC2 counters, cleared
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace qmoe::cuda {

// Index: the caller's integer type for experts (int, or int64_t where it walks an int64 count).
template <typename Index>
__device__ __forceinline__ void store_plan_entry(int32_t* touched, int32_t* tile_start,
                                                 int32_t* ready, Index experts, Index e,
                                                 int32_t count, int32_t i, int32_t t) {
  if (count > 0) {
    touched[i] = static_cast<int32_t>(e);
    tile_start[i] = t;
  } else {
    touched[experts - 1 - (e - i)] = -1;
  }
  if (ready != nullptr) ready[e] = 0;
}

// After every entry: the number of touched experts n and the total of their tiles.
__device__ __forceinline__ void store_plan_end(int32_t* n_touched, int32_t* tile_start, int32_t n,
                                               int32_t tiles) {
  *n_touched = n;
  tile_start[n] = tiles;
}

}  // namespace qmoe::cuda

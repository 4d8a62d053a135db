// Device side of the grouped GEMM's schedule: which rows an M tile covers. Shared by the
// tensor-core and the fp32 kernels, so that both read the schedule arrays the same way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/grouped_gemm.h"

namespace qmoe::cuda::gemm_detail {

// The rows one M tile covers: [row0, row0 + rows) of A and C, multiplied by the group's B.
struct TileRows {
  int64_t row0 = 0;
  int rows = 0;   // 1..kGemmTileM
  int group = 0;  // touched index
};

// Grid rows are capped at this (CUDA's limit on gridDim.y); a block then walks its tiles with
// stride gridDim.y (times the tiles a grid row spans).
constexpr int64_t kMaxGridY = 65535;

// Finds the wave's tile number `y` (0-based within the wave). False when the wave has fewer tiles
// (the grid is sized by an upper bound). Every thread of a block calls this with the same `y`, so
// the loads are broadcasts that L1 serves after the first warp.
__device__ __forceinline__ bool find_tile(const GroupedGemmArgs& p, int64_t y, TileRows* out) {
  const GroupSchedule& s = p.sched;
  const int n_touched = __ldg(s.n_touched);
  // Computed in 64 bits: first_group + max_groups may exceed INT_MAX for a "whole rest" wave.
  const int64_t end64 = static_cast<int64_t>(p.first_group) + p.max_groups;
  const int end = static_cast<int>(end64 < n_touched ? end64 : n_touched);
  if (end <= p.first_group) return false;
  const int64_t t = static_cast<int64_t>(__ldg(s.tile_start + p.first_group)) + y;
  if (t >= __ldg(s.tile_start + end)) return false;
  // The last group whose first tile is <= t. Groups without rows have tile_start equal to their
  // successor's, so the search passes over them to the group that owns tile t.
  int lo = p.first_group, hi = end - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (__ldg(s.tile_start + mid) <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int expert = __ldg(s.touched + lo);
  const int begin = __ldg(s.offsets + expert);
  const int count = __ldg(s.offsets + expert + 1) - begin;
  const int local = static_cast<int>(t - __ldg(s.tile_start + lo)) * kGemmTileM;
  const int left = count - local;
  out->row0 = static_cast<int64_t>(begin) + local;
  out->rows = left < kGemmTileM ? left : kGemmTileM;
  out->group = lo;
  return true;
}

}  // namespace qmoe::cuda::gemm_detail

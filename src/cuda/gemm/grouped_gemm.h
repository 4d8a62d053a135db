// Grouped GEMM over routes sorted by expert: for every group g (a touched expert) and every row p
// of that group,  C[p, n] = sum_k A[p, k] * B_g[n, k]  (both operands K-contiguous, "TN"), fp32
// out.
//
//   bf16 / f16: tensor cores (mma.sync m16n8k16), fp32 accumulation.
//   f32:        CUDA cores, fp32 FMA accumulation (no TF32: the fp32 path is the accurate one).
//
// Groups and rows come from device arrays, so the host never learns the per-expert counts and the
// call needs no synchronization (CUDA-graph safe). A launch covers the groups of one wave:
// touched indices [first_group, min(first_group + max_groups, *n_touched)).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe::cuda {

// Rows per M tile: the planner's tile_start counts ceil(count / kGemmTileM) tiles per group.
constexpr int kGemmTileM = 128;
// K (and the leading dimensions of A and B) must be a multiple of this; callers zero-pad.
constexpr int kGemmKAlign = 32;

struct GroupSchedule {
  const int32_t* touched = nullptr;     // [E] touched expert ids, ascending
  const int32_t* n_touched = nullptr;   // [1] how many
  const int32_t* offsets = nullptr;     // [E + 1] first row (route position) of each expert id
  const int32_t* tile_start = nullptr;  // [E + 1] by touched index: exclusive prefix sum of
                                        //   ceil(count / kGemmTileM); entry n_touched = total
};

struct GroupedGemmArgs {
  DType dtype = DType::kBF16;  // of A and B: kBF16, kF16 or kF32
  const void* a = nullptr;     // [rows, lda], row p = route position p
  int64_t lda = 0;
  const void* b = nullptr;  // group at touched index i: b + (i - first_group) * b_stride elements,
  int64_t ldb = 0;          //   [n, ldb]
  int64_t b_stride = 0;
  float* c = nullptr;  // [rows, ldc]; only rows of the launched groups and columns < n are written
  int64_t ldc = 0;
  int64_t n = 0, k = 0;  // k % kGemmKAlign == 0; lda, ldb >= k and multiples of kGemmKAlign
  GroupSchedule sched;
  int first_group = 0;
  int max_groups = 0;
  int64_t max_tiles = 0;  // an upper bound of the wave's M tiles (grid size along M)
  // The CUTLASS GEMM only (launch_cutlass_grouped_gemm): programmatic dependent launch of its
  // setup kernel and the GEMM, as MixedGemmArgs::pdl.
  bool pdl = false;
};

// Validates the arguments (null or misaligned pointers, k alignment, sizes) and launches on
// `stream`. a, b, c must be 16-byte aligned.
Status launch_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);

}  // namespace qmoe::cuda

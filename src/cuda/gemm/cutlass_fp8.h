// The FP8 grouped GEMM (PrepareOptions::act_quant = "fp8_e4m3"): e4m3 activations times e4m3
// weights on FP8 wgmma, each 128-wide slice of K scaled on the way into fp32 accumulators
// (CUTLASS 3.x's SM90 blockwise-scaled ptr-array kernel). Same schedule contract as
// cutlass_mixed.h: a setup kernel derives each group's shape and pointers on the device, so the
// call never synchronizes and can be captured in a CUDA graph.
//
// The product is transposed as in cutlass_mixed.h (the weights are CUTLASS's A):
//
//            CUTLASS M = n (features)     N = the group's rows      K
//   A    = codes of expert e   [n, k]  e4m3, row-major (K-contiguous)
//   SFA  = its block scales    [ceil(n / 128), k / 128]  f32, one per 128 x 128 block (fp8_block's
//                              own layout; per-expert fp8 repeats its global scale), or with
//                              row_scales [n, k / 128], one per weight row and 128 columns
//                              (MXFP4's e4m3 copy, core/formats/fp4_e4m3.h)
//   B    = the group's rows    [rows, lda]  e4m3 (act_quant.h's rows)
//   SFB  = their scales        [rows, k / 128]  f32, one per row and 128 columns (K-major)
//   D    = C rows of the group [rows, ldc]  bf16 (rounded once from the fp32 accumulators):
//                              D(m, r) = c[(row0 + r) * ldc + m]
//   D(m, r) = sum over K blocks b of SFA(m / 128, b) SFB(r, b) sum_{k in b} A(m, k) B(k, r)
//             (SFA(m, b) with row_scales)
//
// The partial sums of each K block are promoted to the fp32 accumulator with both scales applied
// (CUTLASS's ScalePromotionInterval: every 128 columns), so the scales never round the codes.
//
// Two tiles: 128 x 128 x 128 on the cooperative schedule (two consumer warpgroups split the tile)
// and 128 x 64 x 128 on the pingpong one (each warpgroup owns a tile; one promotes and stores
// while the other multiplies). Few rows per expert take the narrower one (kFp8WideRoutes).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/numeric.h"
#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// The scale block along K and along the weights' rows; k must be a multiple of it.
constexpr int64_t kFp8ScaleBlock = 128;

// An expert's rows of weight scales (SFA): one per 128 weight rows, or with row_scales one per
// weight row. The layer's copies and the GEMM's setup kernel both size them here.
QMOE_HD int64_t fp8_weight_scale_rows(int64_t n, bool row_scales) {
  return row_scales ? n : (n + kFp8ScaleBlock - 1) / kFp8ScaleBlock;
}

struct Fp8GemmArgs {
  const uint8_t* a = nullptr;         // [rows, lda] e4m3 activations, row p = route position p
  const float* a_scales = nullptr;    // [rows, k / 128]
  int64_t lda = 0;
  uint16_t* c = nullptr;  // [rows, ldc] bf16; rows of touched experts, columns < n are written
  int64_t ldc = 0;
  int64_t n = 0, k = 0;
  const uint8_t* codes = nullptr;     // [E, n, k] e4m3
  const float* w_scales = nullptr;    // [E, ceil(n / 128), k / 128], or [E, n, k / 128]
  bool row_scales = false;            // w_scales per weight row (the second form)
  GroupSchedule sched;                // tile_start is not read
  int max_groups = 0;                 // an upper bound of *sched.n_touched (min(E, routes))
  int tile_n = 128;  // the tile's rows: 128 (cooperative 128 x 128) or 64 (pingpong 128 x 64)
};

// The 128-row tile from this many routes per expert on, the 64-row one below. Measured on
// deepseek-v3 (bench/results/2026-12-02-h200-fp8-act.md), 64 / 128 rows: 1302.5 / 1732.9 us at
// 256 tokens (8 routes per expert), 2309.5 / 2550.3 at 1024 (32), 6348.7 / 6267.0 at 4096 (128).
constexpr int64_t kFp8WideRoutes = 128;

// Whether an FC of [n, k] can run: k a multiple of kFp8ScaleBlock, n a multiple of 8 (`why`
// names the rule broken). Host-only.
bool fp8_gemm_shape_ok(int64_t n, int64_t k, std::string* why = nullptr);

// Workspace bytes of one launch over up to max_groups groups: the per-group shape, pointer and
// stride arrays plus CUTLASS's TMA descriptors. 0 for max_groups <= 0. Exact and nondecreasing.
size_t fp8_gemm_workspace_bytes(int64_t max_groups, int sm_count);

// Validates the arguments (shape rules, 16-byte aligned pointers, ldc a multiple of 8) and
// launches the setup kernel and the GEMM on `stream`.
Status launch_fp8_grouped_gemm(const Fp8GemmArgs& args, int sm_count, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream);

}  // namespace qmoe::cuda

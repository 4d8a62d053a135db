// The elementwise stages of the generic path and the planner that turns expert counts into the
// grouped GEMM's schedule. All launches are asynchronous on the given stream.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/dequant/device_fc.h"
#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/layer.h"
#include "qmoe/routing.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// Error bits beyond routing's (device_routing.h): a non-finite input activation.
constexpr int32_t kErrorInput = 4;

// From maps.expert_counts [E]: the touched experts in ascending order (then -1 up to entry E - 1,
// so that a kernel can test its entry without first reading the number), their number, and
// tile_start (exclusive prefix of ceil(count / kGemmTileM), entry n_touched = total tiles);
// ready[e] = 0 for every expert where ready is set (the decode kernels' FC1 -> FC2 counters).
// pdl: launch with programmatic dependent launch (pdl.cuh; the stage's kernels wait for the
// previous kernel before they touch memory and let the next one launch at once).
Status launch_plan(const int32_t* counts, int64_t experts, int32_t* touched, int32_t* n_touched,
                   int32_t* tile_start, int32_t* ready, cudaStream_t stream, bool pdl = false);

// x_perm[p, 0:ld) = input[token of permuted_route[p], :] in the same dtype, zero padded from h to
// ld; a non-finite value sets kErrorInput and error[1] = min(error[1], token).
Status launch_gather(const void* input, DType dtype, int64_t hidden, const int32_t* permuted_route,
                     int slots, int64_t routes, void* x_perm, int64_t ld, int32_t* error,
                     cudaStream_t stream, bool pdl = false);

struct ActivationArgs {
  ActivationSpec act;
  int64_t inter = 0;         // I
  const void* h = nullptr;  // FC1 output [R, ldh] (2I columns for fused gated layouts, else I)
  int64_t ldh = 0;
  // h's element: kF32, or kBF16 (the rows of the FP8 GEMM, cutlass_fp8.h, and of the bf16
  // mixed-input GEMM, cutlass_mixed.h: mixed_out_dtype).
  DType h_dtype = DType::kF32;
  // FC1's columns in GluRows order (cutlass_mixed.h: a banded mixed-input copy, for the
  // activation epilogue or the decode path's shared codes): channel i's gate at column 16 (i / 8) +
  // i % 8, its linear eight columns on. Gated layouts of FC1's own rows only (an FC1 bias stays in
  // ORT's order).
  bool banded = false;
  const void* h3 = nullptr;  // FC3 output [R, ldh3] (separate gated layout), else nullptr
  int64_t ldh3 = 0;
  DType h3_dtype = DType::kF32;  // as h_dtype (FC3 may run on another GEMM than FC1)
  const void* fc1_bias = nullptr;  // [L, fc1 rows] in bias_dtype, or nullptr
  const void* fc3_bias = nullptr;  // [L, I], or nullptr
  DType bias_dtype = DType::kF32;
  int64_t fc1_rows = 0;
  bool scale_input = false;  // CombineMode::kScaleInput: the routing weight scales FC1/FC3 outputs
  const int32_t* permuted_route = nullptr;
  const int32_t* expert_ids = nullptr;
  const float* weights = nullptr;
  int64_t routes = 0;
  // Local experts: routes to experts outside [expert_begin, expert_end) are another shard's, their
  // rows are skipped; the biases hold the range's experts (index e - expert_begin).
  int32_t expert_begin = 0, expert_end = INT32_MAX;
  // Whether a row's work needs its route (its expert for the biases or a shard's range, its
  // routing weight for kScaleInput). false (no biases, no kScaleInput, every expert held) lets the
  // rows kernel skip the two dependent lookups (permuted_route, then expert_ids), which held each
  // warp for two more memory round trips than its rows' loads.
  bool by_route = true;
  void* out = nullptr;  // [R, ld] in out_dtype, zero padded from I to ld
  int64_t ld = 0;
  DType out_dtype = DType::kBF16;
  // FP8 rows instead of `out` (act_quant, core/act_quant.h): codes [R, ld] e4m3 and scales
  // [R, ld / 128]; ld = I rounded up to 128 (the group across I holds zeros past it).
  uint8_t* out_codes = nullptr;
  float* out_scales = nullptr;
  bool pdl = false;  // programmatic dependent launch (launch_plan)
};

// act[p] = activation(scale * h[p] + bias) (the CPU backend's formulas, in fp32), stored in
// out_dtype or quantized to FP8 rows. A warp computes 128 outputs of one route, four per lane,
// where I, ld and the FC1 leading dimensions are multiples of 4 and h, h3, out and the biases
// 16-byte aligned (FP8 rows require it); else a block per route, one output per thread.
Status launch_activation(const ActivationArgs& a, cudaStream_t stream);

// The FP8 rows of the gathered input (act_quant): codes[p, 0:W) and scales[p, 0:W/128] of
// input[token of permuted_route[p], :], W = hidden rounded up to 128 (bf16 or f16; hidden a
// multiple of 4, ldq >= W and a multiple of 16; codes past hidden are 0, act_quant.h); a
// non-finite value sets kErrorInput as launch_gather does. Each token is quantized once, into
// token_codes [tokens, ldq] and token_scales [tokens, W / 128] (16-byte aligned scratch), then
// its rows are copied to every route of it: the input is read once, not once per route.
Status launch_gather_fp8(const void* input, DType dtype, int64_t hidden, int64_t tokens,
                         const int32_t* permuted_route, int slots, uint8_t* token_codes,
                         float* token_scales, uint8_t* codes, int64_t ldq, float* scales,
                         int32_t* error, cudaStream_t stream);

// The terms of the combine, out[t, c] = sum over the held slots j, in slot order, in fp32 of
// w_j * (y_j[c] + b2[e_j, c]) (without w_j for kScaleInput), cast to out_dtype (+0 where no slot
// is held): the finalize kernel's, over FC2's rows y_j = y[pos(t, j)], and FC2's own with the
// combine (DecodeFcArgs::combine), over its blocks' sums.
struct CombineTerms {
  const int32_t* route_position = nullptr;  // by route id t * slots + j (RouteMapsView)
  const int32_t* expert_ids = nullptr;      // by route id, the global expert
  const float* weights = nullptr;           // by route id
  // Local experts: the slots whose expert is outside [expert_begin, expert_end) are another
  // shard's and add nothing (their y rows are never written); bias row e - expert_begin.
  int32_t expert_begin = 0, expert_end = INT32_MAX;
  bool scale_input = false;
  const void* bias = nullptr;  // FC2's bias [L, H] in bias_dtype, or nullptr
  DType bias_dtype = DType::kF32;
  int64_t tokens = 0, hidden = 0;
  int slots = 0;
  void* out = nullptr;  // [T, H] in out_dtype
  DType out_dtype = DType::kBF16;
};

struct FinalizeArgs {
  const void* y = nullptr;  // FC2 output [R, ldy] by route position
  int64_t ldy = 0;
  DType y_dtype = DType::kF32;  // kF32, or kBF16 (FP8 and bf16 mixed-input GEMMs' rows)
  CombineTerms terms;
  bool pdl = false;  // programmatic dependent launch: slots are read before waiting for FC2
};

// The combine of `a.terms` over FC2's rows y. Deterministic: no atomics.
Status launch_finalize(const FinalizeArgs& a, cudaStream_t stream);

}  // namespace qmoe::cuda

// Planner, gather, activation and finalize kernels of the generic path.
#include <cuda_fp8.h>

#include <cub/block/block_scan.cuh>

#include "core/act_quant.h"
#include "core/numeric.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/stamps.cuh"
#include "cuda/common/stamps.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/activation.cuh"
#include "cuda/layer/combine.cuh"
#include "cuda/layer/plan_entries.cuh"
#include "cuda/layer/stages.h"

namespace qmoe::cuda {
namespace {

__device__ __forceinline__ void record_error(int32_t* error, int32_t bit, int64_t token) {
  atomicOr(error, bit);
  atomicMin(error + 1, static_cast<int32_t>(token));
}

constexpr int kPlanThreads = 1024;

// One block walks the experts in chunks of kPlanThreads; two block scans per chunk give each
// touched expert its index and its first tile, carried across chunks.
__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(const int32_t* counts, int64_t experts, int32_t* touched, int32_t* n_touched,
                int32_t* tile_start, int32_t* ready) {
  using Scan = cub::BlockScan<int2, kPlanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  pdl_wait();     // programmatic dependent launch: the previous kernel's results (pdl.cuh)
  pdl_trigger();  // the next kernel may launch; it waits for this one's end itself
  __shared__ int2 carry;
  if (threadIdx.x == 0) carry = make_int2(0, 0);
  __syncthreads();
  for (int64_t base = 0; base < experts; base += kPlanThreads) {
    const int64_t e = base + threadIdx.x;
    const int32_t c = e < experts ? counts[e] : 0;
    const int2 mine = make_int2(c > 0 ? 1 : 0, (c + kGemmTileM - 1) / kGemmTileM);
    int2 prefix, total;
    Scan(tmp).ExclusiveScan(
        mine, prefix, make_int2(0, 0),
        [](const int2& a, const int2& b) { return make_int2(a.x + b.x, a.y + b.y); }, total);
    const int2 at = carry;
    if (e < experts) {
      store_plan_entry(touched, tile_start, ready, experts, e, c, at.x + prefix.x, at.y + prefix.y);
    }
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == 0) carry = make_int2(at.x + total.x, at.y + total.y);
    __syncthreads();
  }
  if (threadIdx.x == 0) store_plan_end(n_touched, tile_start, carry.x, carry.y);
}

// A bf16/f16 row in 16-byte pieces (8 elements): hidden and ld multiples of 8, the input 16-byte
// aligned (launch_gather checks).
__global__ void gather16_kernel(const uint4* input, bool bf16, int64_t hidden8,
                                const int32_t* permuted_route, int slots, uint4* x_perm,
                                int64_t ld8, int32_t* error) {
  pdl_wait();
  pdl_trigger();
  const int64_t p = blockIdx.x;
  const int64_t token = permuted_route[p] / slots;
  const uint4* src = input + token * hidden8;
  uint4* dst = x_perm + p * ld8;
  bool bad = false;
  for (int64_t c = threadIdx.x; c < ld8; c += blockDim.x) {
    const uint4 v = c < hidden8 ? src[c] : make_uint4(0, 0, 0, 0);
    bad |= nonfinite16x8(v, bf16);
    dst[c] = v;
  }
  if (bad) record_error(error, kErrorInput, token);
}

__global__ void gather_kernel(const void* input, DType dtype, int64_t hidden,
                              const int32_t* permuted_route, int slots, void* x_perm, int64_t ld,
                              int32_t* error) {
  pdl_wait();
  pdl_trigger();
  const int64_t p = blockIdx.x;
  const int64_t token = permuted_route[p] / slots;
  bool bad = false;
  if (dtype == DType::kF32) {
    const float* src = static_cast<const float*>(input) + token * hidden;
    float* dst = static_cast<float*>(x_perm) + p * ld;
    for (int64_t c = threadIdx.x; c < ld; c += blockDim.x) {
      const float v = c < hidden ? src[c] : 0.0f;
      bad |= !isfinite(v);
      dst[c] = v;
    }
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(input) + token * hidden;
    uint16_t* dst = static_cast<uint16_t*>(x_perm) + p * ld;
    const bool bf16 = dtype == DType::kBF16;
    for (int64_t c = threadIdx.x; c < ld; c += blockDim.x) {
      const uint16_t v = c < hidden ? src[c] : 0;
      bad |= nonfinite16(v, bf16);
      dst[c] = v;
    }
  }
  if (bad) record_error(error, kErrorInput, token);
}

// Output i of a route of held expert e (its bias row) from its raw dot products: g, FC1's gate row
// (the only row of an ungated activation), and l, the linear row (FC1's or FC3's); each becomes
// scale * dot + bias, then the activation, as the CPU backend computes it. Both activation kernels
// call this, so their bits agree.
__device__ __forceinline__ float activation_output(const ActivationArgs& a, int64_t e, float scale,
                                                   int64_t i, float g, float l) {
  const int64_t I = a.inter;
  const bool gated = is_gated(a.act.kind);
  int64_t gate_row = i, lin_row = I + i;  // FC1 rows, for its bias
  if (gated && a.act.glu == GluLayout::kInterleaved) gate_row = 2 * i, lin_row = 2 * i + 1;
  const float bg =
      a.fc1_bias ? load_scalar(a.fc1_bias, a.bias_dtype, e * a.fc1_rows + gate_row) : 0.0f;
  if (!gated) return scalar_act(a.act.kind, scale * g + bg);
  float bl = 0.0f;
  if (a.act.glu == GluLayout::kSeparateFc3) {
    bl = a.fc3_bias ? load_scalar(a.fc3_bias, a.bias_dtype, e * I + i) : 0.0f;
  } else if (a.fc1_bias) {
    bl = load_scalar(a.fc1_bias, a.bias_dtype, e * a.fc1_rows + lin_row);
  }
  return act_of_dots(a.act, scale, g, l, bg, bl);
}

// A block per route position p, one output per thread: any shape and alignment.
__global__ void activation_kernel(ActivationArgs a) {
  pdl_wait();
  pdl_trigger();
  const int64_t p = blockIdx.x;
  const int32_t r = a.permuted_route[p];
  const int32_t id = a.expert_ids[r];
  // Another shard's route: FC1 left its row unwritten and the combine skips it.
  if (id < a.expert_begin || id >= a.expert_end) return;
  const int64_t e = id - a.expert_begin;  // the bias row
  const float scale = a.scale_input ? a.weights[r] : 1.0f;
  const int64_t row = p * a.ldh, row3 = p * a.ldh3;
  const int64_t I = a.inter;
  const bool gated = is_gated(a.act.kind);
  auto h = [&a, row](int64_t c) { return load_scalar(a.h, a.h_dtype, row + c); };
  for (int64_t i = threadIdx.x; i < a.ld; i += blockDim.x) {
    float v = 0.0f;
    if (i < I) {
      float g, l = 0.0f;
      if (a.banded) {  // GluRows order
        const int64_t at = glu_band_gate_row(i);
        g = h(at), l = h(at + 8);
      } else if (gated && a.act.glu == GluLayout::kInterleaved) {  // (gate, linear) pairs
        g = h(2 * i), l = h(2 * i + 1);
      } else {
        g = h(i);
        if (gated) {
          l = a.act.glu == GluLayout::kConcatenated ? h(I + i)
                                                    : load_scalar(a.h3, a.h3_dtype, row3 + i);
        }
      }
      v = activation_output(a, e, scale, i, g, l);
    }
    store_float(a.out, a.out_dtype, p * a.ld + i, v);
  }
}

// The FP8 codes of four values in one word (first value in the low byte), each e4m3(v * inv)
// by cvt.rn.satfinite, the conversion num::f32_to_e4m3 reproduces.
__device__ __forceinline__ uint32_t e4m3_word(const float v[4], float inv) {
  const float2 lo = make_float2(v[0] * inv, v[1] * inv);
  const float2 hi = make_float2(v[2] * inv, v[3] * inv);
  return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3)) |
         (static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3)) << 16);
}

// The amax of a warp's group of 128 values, four per lane (core/act_quant.h).
__device__ __forceinline__ float warp_group_amax(const float v[4]) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
  return amax;
}

// Stores a warp's group: a word of codes per lane, the scale by lane 0.
__device__ __forceinline__ void store_group(const float v[4], uint8_t* codes, float* scale) {
  const float amax = warp_group_amax(v);
  *reinterpret_cast<uint32_t*>(codes) = e4m3_word(v, e4m3_group_inverse(amax));
  if (threadIdx.x % 32 == 0) *scale = e4m3_group_scale(amax);
}

// Four consecutive values of type t from index i (a multiple of 4 on a 16-byte aligned row: one
// 16-byte load for f32, one 8-byte load for bf16 and f16), converted as load_scalar converts
// them: FC1 rows (f32, or bf16 from the FP8 GEMM and the bf16 mixed-input GEMM) and biases.
__device__ __forceinline__ void load4_as(const void* b, DType t, int64_t i, float (&v)[4]) {
  if (t == DType::kF32) {
    const float4 x = *reinterpret_cast<const float4*>(static_cast<const float*>(b) + i);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  } else if (t == DType::kBF16) {  // one 8-byte load
    words16x4_to_f32(*reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(b) + i), true,
                     v);
  } else if (t == DType::kF16) {
    words16x4_to_f32(*reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(b) + i), false,
                     v);
  } else {
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = load_scalar(b, t, i + u);
  }
}

// The gate and linear values of four (gate, linear) pairs from index i (eight values).
__device__ __forceinline__ void load4_pairs(const void* b, DType t, int64_t i, float (&g)[4],
                                            float (&l)[4]) {
  float x[4], y[4];
  load4_as(b, t, i, x);
  load4_as(b, t, i + 4, y);
  g[0] = x[0], l[0] = x[1], g[1] = x[2], l[1] = x[3];
  g[2] = y[0], l[2] = y[1], g[3] = y[2], l[3] = y[3];
}

// The gate and linear biases of outputs i0..i0+3 of held expert e: the rows activation_output
// reads, four at a time (bg, bl stay 0 where the layer has no such bias). Gated layouts only;
// the biases keep ORT's order also where FC1's columns are banded (ActivationArgs::banded).
__device__ __forceinline__ void load_gated_biases(const ActivationArgs& a, int64_t e, int64_t i0,
                                                  float (&bg)[4], float (&bl)[4]) {
  const int64_t I = a.inter;
  if (a.act.glu == GluLayout::kSeparateFc3) {
    if (a.fc1_bias) load4_as(a.fc1_bias, a.bias_dtype, e * a.fc1_rows + i0, bg);
    if (a.fc3_bias) load4_as(a.fc3_bias, a.bias_dtype, e * I + i0, bl);
  } else if (a.fc1_bias && a.act.glu == GluLayout::kInterleaved) {  // (gate, linear) pairs
    load4_pairs(a.fc1_bias, a.bias_dtype, e * a.fc1_rows + 2 * i0, bg, bl);
  } else if (a.fc1_bias) {  // concatenated: gate rows, then linear rows
    load4_as(a.fc1_bias, a.bias_dtype, e * a.fc1_rows + i0, bg);
    load4_as(a.fc1_bias, a.bias_dtype, e * a.fc1_rows + I + i0, bl);
  }
}

// A warp per (route position p, 128 outputs), four consecutive outputs i0..i0+3 per lane: the
// grid is (route positions / 8, ld / 128), so nothing is divided. Four outputs a lane measured
// as fast as eight at 4096 tokens and up to 3% faster (whole layer) below, where eight leave too
// few warps to hide each warp's chain of loads (bench/results/
// 2026-12-04-h200-activation-lanes.md). The FC1 values depend on p alone, so their loads are
// issued before the route lookups and overlap them, and a layer whose rows need no route
// (ActivationArgs::by_route false) makes none; the stores are 8 bytes (16-bit outputs), 16
// (f32) or, for FP8 rows, a word of codes per lane and the warp's group scale (store_group: a
// warp's 128 outputs are one group). FC1's and FC3's rows are read as their dtypes say
// (ActivationArgs::h_dtype, h3_dtype; a uniform branch per load). kSwiGlu: the layer's
// activation is SwiGLU, computed without the per-value switch over kinds and with its biases
// loaded four at a time (the same values and arithmetic as activation_output, act_of_dots, so
// the same bits). Requires I, ld, ldh and ldh3 multiples of 4 (a lane's four outputs, and its
// loads and stores of 8 or 16 bytes aligned) and h, h3, out and the biases 16-byte aligned
// (launch_activation checks); whole warps return together, so the FP8 group reduction has every
// lane.
template <bool kFp8, bool kSwiGlu>
__global__ void __launch_bounds__(256) activation_rows_kernel(ActivationArgs a) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (p >= a.routes) return;
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * 128 + 4 * lane;
  const int64_t I = a.inter;
  const bool live = i0 < I;  // I % 4 == 0: a lane's four outputs are all live or all padding
  const bool gated = kSwiGlu || is_gated(a.act.kind);
  float g[4] = {0, 0, 0, 0}, l[4] = {0, 0, 0, 0};
  if (live) {
    const int64_t row = p * a.ldh;
    const DType ht = a.h_dtype;
    if (a.banded) {  // GluRows order: i0..i0 + 3 lie in one band's gate half (i0 % 4 == 0)
      const int64_t at = row + glu_band_gate_row(i0);
      load4_as(a.h, ht, at, g);
      load4_as(a.h, ht, at + 8, l);
    } else if (!gated || a.act.glu != GluLayout::kInterleaved) {
      load4_as(a.h, ht, row + i0, g);
      if (gated && a.act.glu == GluLayout::kConcatenated) {
        load4_as(a.h, ht, row + I + i0, l);
      } else if (gated) {
        load4_as(a.h3, a.h3_dtype, p * a.ldh3 + i0, l);
      }
    } else {  // (gate, linear) pairs
      load4_pairs(a.h, ht, row + 2 * i0, g, l);
    }
  }
  int64_t e = 0;  // the bias row
  float scale = 1.0f;
  if (a.by_route) {
    const int32_t r = a.permuted_route[p];
    const int32_t id = a.expert_ids[r];
    // Another shard's route: FC1 left its row unwritten and the combine skips it.
    if (id < a.expert_begin || id >= a.expert_end) return;
    e = id - a.expert_begin;
    if (a.scale_input) scale = a.weights[r];
  }
  float v[4] = {0, 0, 0, 0};
  if (live) {
    if (kSwiGlu) {
      float bg[4] = {0, 0, 0, 0}, bl[4] = {0, 0, 0, 0};
      if (a.fc1_bias || a.fc3_bias) load_gated_biases(a, e, i0, bg, bl);
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = act_of_dots(a.act, scale, g[u], l[u], bg[u], bl[u]);
    } else {
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = activation_output(a, e, scale, i0 + u, g[u], l[u]);
    }
  }
  if constexpr (kFp8) {
    // ld a multiple of 128 (>= I): the warp's 128 outputs are one group; where I is not a
    // multiple of 128, the group across I holds zeros past it (codes 0, act_quant.h).
    store_group(v, a.out_codes + p * a.ld + i0,
                a.out_scales + p * (a.ld / kActQuantGroup) + i0 / kActQuantGroup);
  } else {
    if (i0 >= a.ld) return;  // [I, ld): zeros
    const int64_t at = p * a.ld + i0;
    if (a.out_dtype == DType::kF32) {
      *reinterpret_cast<float4*>(static_cast<float*>(a.out) + at) =
          make_float4(v[0], v[1], v[2], v[3]);
      return;
    }
    const bool bf16 = a.out_dtype == DType::kBF16;
    uint32_t w[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const uint32_t lo = bf16 ? num::f32_to_bf16(v[2 * u]) : num::f32_to_f16(v[2 * u]);
      const uint32_t hi = bf16 ? num::f32_to_bf16(v[2 * u + 1]) : num::f32_to_f16(v[2 * u + 1]);
      w[u] = lo | (hi << 16);
    }
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(a.out) + at) = make_uint2(w[0], w[1]);
  }
}

// A warp per (token t, 128 columns of its row), four values per lane: one 8-byte load where the
// input is 8-byte aligned (every row is then: hidden is a multiple of 4). A last group cut short
// by hidden (not a multiple of 128) quantizes its values with zeros after them (act_quant.h).
__global__ void __launch_bounds__(256)
    quantize_tokens_kernel(const uint16_t* input, bool bf16, bool aligned8, int64_t hidden,
                           int64_t tokens, uint8_t* codes, int64_t ldq, float* scales,
                           int32_t* error) {
  const int64_t chunks = (hidden + kActQuantGroup - 1) / kActQuantGroup;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (item >= tokens * chunks) return;
  const int64_t t = item / chunks;
  const int64_t chunk = item - t * chunks;
  const int64_t c0 = chunk * kActQuantGroup + 4 * lane;
  const uint16_t* src = input + t * hidden + c0;
  uint16_t b[4] = {0, 0, 0, 0};  // past hidden: zeros (hidden % 4 == 0: all four or none)
  if (c0 < hidden && aligned8) {
    const uint2 w = *reinterpret_cast<const uint2*>(src);
    b[0] = w.x & 0xFFFFu, b[1] = w.x >> 16, b[2] = w.y & 0xFFFFu, b[3] = w.y >> 16;
  } else if (c0 < hidden) {
    for (int u = 0; u < 4; ++u) b[u] = src[u];
  }
  float v[4];
  bool bad = false;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    bad |= nonfinite16(b[u], bf16);
    v[u] = bf16 ? num::bf16_to_f32(b[u]) : num::f16_to_f32(b[u]);
  }
  store_group(v, codes + t * ldq + c0, scales + t * chunks + chunk);
  if (bad) record_error(error, kErrorInput, t);
}

// A block per route position p: the token's codes (16-byte pieces) and scales.
__global__ void gather_token_rows_kernel(const uint4* token_codes, const float* token_scales,
                                         const int32_t* permuted_route, int slots, int64_t row16,
                                         int64_t ld16, int64_t chunks, uint4* codes,
                                         float* scales) {
  const int64_t p = blockIdx.x;
  const int64_t t = permuted_route[p] / slots;
  for (int64_t c = threadIdx.x; c < row16; c += blockDim.x) {
    codes[p * ld16 + c] = token_codes[t * ld16 + c];
  }
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    scales[p * chunks + c] = token_scales[t * chunks + c];
  }
}

// The token's slots (position, weight, expert) go to shared memory first: read from global inside
// the sum, each would cost two dependent memory round trips per slot. The sum then runs in slot
// order with four FC2 outputs loaded ahead.
// kCols columns per thread: 4 where hidden and ldy are multiples of 4 (16-byte loads of f32 y
// rows, 8-byte of bf16; launch_finalize checks), else 1. Y is y's element (combine.cuh).
template <int kCols, typename Y>
__global__ void finalize_kernel(FinalizeArgs a) {
  extern __shared__ int32_t slot_info[];  // [slots] positions, [slots] expert ids, [slots] weights
  const CombineTerms& m = a.terms;
  const int64_t t = blockIdx.y;
  int32_t* s_pos = slot_info;
  int32_t* s_expert = slot_info + m.slots;
  float* s_weight = reinterpret_cast<float*>(slot_info + 2 * m.slots);
  QMOE_STAMP_SCOPE(0);
  for (int j = threadIdx.x; j < m.slots; j += blockDim.x) {
    const int64_t r = t * m.slots + j;
    s_pos[j] = m.route_position[r];
    s_expert[j] = m.expert_ids[r];
    s_weight[j] = m.weights[r];
  }
  pdl_wait();  // FC2's outputs
  QMOE_STAMP_WAITED(0);
  __syncthreads();
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kCols;
  if (c < m.hidden) {  // one exit for the whole block (the stamps' end waits for all threads)
    float v[kCols];
    combine_columns<kCols, Y>(a, s_pos, s_expert, s_weight, c, v);
#pragma unroll
    for (int u = 0; u < kCols; ++u) store_float(m.out, m.out_dtype, t * m.hidden + c + u, v[u]);
  }
}

}  // namespace

#if defined(QMOE_STAMPS)
QMOE_STAMPS_EXPORT(stamps_take_finalize)
#endif

Status launch_plan(const int32_t* counts, int64_t experts, int32_t* touched, int32_t* n_touched,
                   int32_t* tile_start, int32_t* ready, cudaStream_t stream, bool pdl) {
  if (!counts || !touched || !n_touched || !tile_start || experts <= 0) {
    return Status::invalid("plan: null array or no experts");
  }
  QMOE_CUDA_TRY(launch_maybe_pdl(&plan_kernel, dim3(1), dim3(kPlanThreads), 0, stream, pdl, counts,
                                 experts, touched, n_touched, tile_start, ready));
  QMOE_CUDA_CHECK_LAUNCH("plan_kernel");
  return Status::ok();
}

Status launch_gather(const void* input, DType dtype, int64_t hidden, const int32_t* permuted_route,
                     int slots, int64_t routes, void* x_perm, int64_t ld, int32_t* error,
                     cudaStream_t stream, bool pdl) {
  if (routes <= 0) return Status::ok();
  if (routes > 0x7FFFFFFF) return Status::invalid("gather: too many routes");
  if (dtype != DType::kF32 && hidden % 8 == 0 && ld % 8 == 0 &&
      reinterpret_cast<uintptr_t>(input) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(x_perm) % 16 == 0) {
    // 16-byte pieces; 128 threads cover a 2048-wide row in two passes.
    QMOE_CUDA_TRY(launch_maybe_pdl(&gather16_kernel, dim3(static_cast<unsigned>(routes)), dim3(128),
                                   0, stream, pdl, static_cast<const uint4*>(input),
                                   dtype == DType::kBF16, hidden / 8, permuted_route, slots,
                                   static_cast<uint4*>(x_perm), ld / 8, error));
    QMOE_CUDA_CHECK_LAUNCH("gather16_kernel");
    return Status::ok();
  }
  QMOE_CUDA_TRY(launch_maybe_pdl(&gather_kernel, dim3(static_cast<unsigned>(routes)), dim3(256), 0,
                                 stream, pdl, input, dtype, hidden, permuted_route, slots, x_perm,
                                 ld, error));
  QMOE_CUDA_CHECK_LAUNCH("gather_kernel");
  return Status::ok();
}

Status launch_activation(const ActivationArgs& a, cudaStream_t stream) {
  if (a.routes <= 0) return Status::ok();
  auto al = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  const bool fp8 = a.out_codes != nullptr;
  auto rows_dtype = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  if (!rows_dtype(a.h_dtype) || !rows_dtype(a.h3_dtype)) {
    return Status::invalid("activation: h_dtype, h3_dtype: expected f32 or bf16");
  }
  const bool separate = a.act.gated() && a.act.glu == GluLayout::kSeparateFc3;
  const bool out_ok = fp8 ? al(a.out_codes, 8) && a.out_scales != nullptr && a.ld >= a.inter &&
                                a.ld % kActQuantGroup == 0 && a.ld - a.inter < kActQuantGroup
                          : al(a.out, 16);
  const bool rows = a.inter % 4 == 0 && a.ld % 4 == 0 && a.ldh % 4 == 0 && al(a.h, 16) &&
                    (!separate || (a.ldh3 % 4 == 0 && al(a.h3, 16))) && out_ok &&
                    al(a.fc1_bias, 16) && al(a.fc3_bias, 16);  // biases read 4 at a time
  if (!rows) {
    if (fp8) {
      return Status::invalid(
          "activation: FP8 rows need ld = I rounded up to 128 and aligned rows");
    }
    QMOE_CUDA_TRY(launch_maybe_pdl(&activation_kernel, dim3(static_cast<unsigned>(a.routes)),
                                   dim3(256), 0, stream, a.pdl, a));
    QMOE_CUDA_CHECK_LAUNCH("activation_kernel");
    return Status::ok();
  }
  const int64_t blocks = (a.routes + 7) / 8;  // 8 warps per block, a warp per route position
  const int64_t slices = (a.ld + 127) / 128;  // 128 outputs per warp
  if (blocks > 0x7FFFFFFF || slices > 65535) {
    return Status::invalid("activation: too many routes or columns");
  }
  const bool swiglu = a.act.kind == Activation::kSwiGlu;
  auto* kernel = fp8 ? (swiglu ? &activation_rows_kernel<true, true>
                               : &activation_rows_kernel<true, false>)
                     : (swiglu ? &activation_rows_kernel<false, true>
                               : &activation_rows_kernel<false, false>);
  QMOE_CUDA_TRY(launch_maybe_pdl(kernel,
                                 dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(slices)),
                                 dim3(256), 0, stream, a.pdl, a));
  QMOE_CUDA_CHECK_LAUNCH("activation_rows_kernel");
  return Status::ok();
}

Status launch_gather_fp8(const void* input, DType dtype, int64_t hidden, int64_t tokens,
                         const int32_t* permuted_route, int slots, uint8_t* token_codes,
                         float* token_scales, uint8_t* codes, int64_t ldq, float* scales,
                         int32_t* error, cudaStream_t stream) {
  if (tokens <= 0) return Status::ok();
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return Status::invalid("gather_fp8: input dtype: expected bf16 or f16");
  }
  auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t chunks = (hidden + kActQuantGroup - 1) / kActQuantGroup;
  const int64_t width = chunks * kActQuantGroup;  // the codes' row: whole groups
  if (hidden <= 0 || hidden % 4 != 0 || ldq < width || ldq % 16 != 0 || !al16(codes) ||
      !al16(token_codes) || scales == nullptr || token_scales == nullptr) {
    return Status::invalid(
        "gather_fp8: hidden a multiple of 4, ldq >= hidden rounded up to 128 and a multiple of "
        "16, codes 16-byte aligned");
  }
  const int64_t blocks = (tokens * chunks + 7) / 8;  // a warp per token and 128 columns
  const int64_t routes = tokens * slots;
  if (blocks > 0x7FFFFFFF || routes > 0x7FFFFFFF) {
    return Status::invalid("gather_fp8: too many tokens");
  }
  quantize_tokens_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
      static_cast<const uint16_t*>(input), dtype == DType::kBF16,
      reinterpret_cast<uintptr_t>(input) % 8 == 0, hidden, tokens, token_codes, ldq, token_scales,
      error);
  QMOE_CUDA_CHECK_LAUNCH("quantize_tokens_kernel");
  gather_token_rows_kernel<<<static_cast<unsigned>(routes), 128, 0, stream>>>(
      reinterpret_cast<const uint4*>(token_codes), token_scales, permuted_route, slots, width / 16,
      ldq / 16, chunks, reinterpret_cast<uint4*>(codes), scales);
  QMOE_CUDA_CHECK_LAUNCH("gather_token_rows_kernel");
  return Status::ok();
}

Status launch_finalize(const FinalizeArgs& a, cudaStream_t stream) {
  const CombineTerms& m = a.terms;
  if (m.tokens <= 0) return Status::ok();
  if (m.tokens > 65535) {
    // Grid y is limited to 65535: run token chunks.
    for (int64_t t0 = 0; t0 < m.tokens; t0 += 65535) {
      FinalizeArgs c = a;
      const int64_t n = m.tokens - t0 < 65535 ? m.tokens - t0 : 65535;
      c.terms.tokens = n;
      c.terms.route_position = m.route_position + t0 * m.slots;
      c.terms.expert_ids = m.expert_ids + t0 * m.slots;
      c.terms.weights = m.weights + t0 * m.slots;
      c.terms.out = static_cast<char*>(m.out) + t0 * m.hidden * dtype_size(m.out_dtype);
      QMOE_RETURN_IF_ERROR(launch_finalize(c, stream));
    }
    return Status::ok();
  }
  if (m.slots > 4096) return Status::invalid("finalize: at most 4096 slots per token");
  if (a.y_dtype != DType::kF32 && a.y_dtype != DType::kBF16) {
    return Status::invalid("finalize: y_dtype: expected f32 or bf16");
  }
  const bool bf16 = a.y_dtype == DType::kBF16;
  const bool four = m.hidden % 4 == 0 && a.ldy % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(a.y) % (bf16 ? 8 : 16) == 0;
  if (bf16 && !four) {  // the FP8 path's rows always are (H a multiple of 128)
    return Status::invalid("finalize: bf16 y: hidden and ldy multiples of 4, 8-byte aligned rows");
  }
  const int64_t per_block = four ? 512 : 128;  // 128 threads
  const dim3 grid(static_cast<unsigned>((m.hidden + per_block - 1) / per_block),
                  static_cast<unsigned>(m.tokens));
  auto* kernel = bf16 ? &finalize_kernel<4, uint16_t>
                      : four ? &finalize_kernel<4, float> : &finalize_kernel<1, float>;
  QMOE_CUDA_TRY(launch_maybe_pdl(kernel, grid, dim3(128), 12 * static_cast<size_t>(m.slots), stream,
                                 a.pdl, a));
  QMOE_CUDA_CHECK_LAUNCH("finalize_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda

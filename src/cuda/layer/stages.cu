// Planner, gather, activation and finalize kernels of the generic path.
#include <cub/block/block_scan.cuh>

#include "core/numeric.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/layer/activation.cuh"
#include "cuda/layer/combine.cuh"
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
                int32_t* tile_start) {
  using Scan = cub::BlockScan<int2, kPlanThreads>;
  __shared__ typename Scan::TempStorage tmp;
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
    if (c > 0) {
      touched[at.x + prefix.x] = static_cast<int32_t>(e);
      tile_start[at.x + prefix.x] = at.y + prefix.y;
    } else if (e < experts) {  // the untouched fill the list from its end
      touched[experts - 1 - (e - at.x - prefix.x)] = -1;
    }
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == 0) carry = make_int2(at.x + total.x, at.y + total.y);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *n_touched = carry.x;
    tile_start[carry.x] = carry.y;
  }
}

// A bf16/f16 row in 16-byte pieces (8 elements): hidden and ld multiples of 8, the input 16-byte
// aligned (launch_gather checks). A 16-bit element is non-finite when its exponent field is all
// ones, tested on both halves of each 32-bit word at once.
__global__ void gather16_kernel(const uint4* input, uint32_t exp_mask2, int64_t hidden8,
                                const int32_t* permuted_route, int slots, uint4* x_perm,
                                int64_t ld8, int32_t* error) {
  const int64_t p = blockIdx.x;
  const int64_t token = permuted_route[p] / slots;
  const uint4* src = input + token * hidden8;
  uint4* dst = x_perm + p * ld8;
  bool bad = false;
  for (int64_t c = threadIdx.x; c < ld8; c += blockDim.x) {
    const uint4 v = c < hidden8 ? src[c] : make_uint4(0, 0, 0, 0);
    for (uint32_t w : {v.x, v.y, v.z, v.w}) {
      const uint32_t e = w & exp_mask2;
      bad |= (e & 0xFFFFu) == (exp_mask2 & 0xFFFFu) || (e >> 16) == (exp_mask2 >> 16);
    }
    dst[c] = v;
  }
  if (bad) record_error(error, kErrorInput, token);
}

__global__ void gather_kernel(const void* input, DType dtype, int64_t hidden,
                              const int32_t* permuted_route, int slots, void* x_perm, int64_t ld,
                              int32_t* error) {
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
    // f16 and bf16 both keep an all-ones exponent for inf/nan.
    const uint16_t exp_mask = dtype == DType::kF16 ? 0x7C00u : 0x7F80u;
    for (int64_t c = threadIdx.x; c < ld; c += blockDim.x) {
      const uint16_t v = c < hidden ? src[c] : 0;
      bad |= (v & exp_mask) == exp_mask;
      dst[c] = v;
    }
  }
  if (bad) record_error(error, kErrorInput, token);
}

__global__ void activation_kernel(ActivationArgs a) {
  const int64_t p = blockIdx.x;
  const int32_t r = a.permuted_route[p];
  const int32_t id = a.expert_ids[r];
  // Another shard's route: FC1 left its row unwritten and the combine skips it.
  if (id < a.expert_begin || id >= a.expert_end) return;
  const int64_t e = id - a.expert_begin;  // the bias row
  const float scale = a.scale_input ? a.weights[r] : 1.0f;
  const float* h = a.h + p * a.ldh;
  const float* h3 = a.h3 ? a.h3 + p * a.ldh3 : nullptr;
  const int64_t I = a.inter;
  // FC1 (and FC3) output n of this route: scale * dot + bias, as the CPU backend computes it.
  auto fc1 = [&](int64_t n) {
    const float b = a.fc1_bias ? load_scalar(a.fc1_bias, a.bias_dtype, e * a.fc1_rows + n) : 0.0f;
    return scale * h[n] + b;
  };
  auto fc3 = [&](int64_t n) {
    const float b = a.fc3_bias ? load_scalar(a.fc3_bias, a.bias_dtype, e * I + n) : 0.0f;
    return scale * h3[n] + b;
  };
  for (int64_t i = threadIdx.x; i < a.ld; i += blockDim.x) {
    float v = 0.0f;
    if (i < I) {
      if (!is_gated(a.act.kind)) {
        v = scalar_act(a.act.kind, fc1(i));
      } else {
        float gate, lin;
        switch (a.act.glu) {
          case GluLayout::kInterleaved:
            gate = fc1(2 * i), lin = fc1(2 * i + 1);
            break;
          case GluLayout::kConcatenated:
            gate = fc1(i), lin = fc1(I + i);
            break;
          default:
            gate = fc1(i), lin = fc3(i);
            break;
        }
        v = gated_act(a.act, gate, lin);
      }
    }
    store_float(a.out, a.out_dtype, p * a.ld + i, v);
  }
}

// The token's slots (position, weight, expert) go to shared memory first: read from global inside
// the sum, each would cost two dependent memory round trips per slot. The sum then runs in slot
// order with four FC2 outputs loaded ahead.
// kCols columns per thread: 4 where hidden and ldy are multiples of 4 (16-byte loads of y rows,
// launch_finalize checks), else 1.
template <int kCols>
__global__ void finalize_kernel(FinalizeArgs a) {
  extern __shared__ int32_t slot_info[];  // [slots] positions, [slots] expert ids, [slots] weights
  const int64_t t = blockIdx.y;
  int32_t* s_pos = slot_info;
  int32_t* s_expert = slot_info + a.slots;
  float* s_weight = reinterpret_cast<float*>(slot_info + 2 * a.slots);
  for (int j = threadIdx.x; j < a.slots; j += blockDim.x) {
    const int64_t r = t * a.slots + j;
    s_pos[j] = a.route_position[r];
    s_expert[j] = a.expert_ids[r];
    s_weight[j] = a.weights[r];
  }
  pdl_wait();  // FC2's outputs
  __syncthreads();
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kCols;
  if (c >= a.hidden) return;
  float v[kCols];
  combine_columns<kCols>(a, s_pos, s_expert, s_weight, c, v);
#pragma unroll
  for (int u = 0; u < kCols; ++u) store_float(a.out, a.out_dtype, t * a.hidden + c + u, v[u]);
}

}  // namespace

Status launch_plan(const int32_t* counts, int64_t experts, int32_t* touched, int32_t* n_touched,
                   int32_t* tile_start, cudaStream_t stream) {
  if (!counts || !touched || !n_touched || !tile_start || experts <= 0) {
    return Status::invalid("plan: null array or no experts");
  }
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(counts, experts, touched, n_touched, tile_start);
  QMOE_CUDA_CHECK_LAUNCH("plan_kernel");
  return Status::ok();
}

Status launch_gather(const void* input, DType dtype, int64_t hidden, const int32_t* permuted_route,
                     int slots, int64_t routes, void* x_perm, int64_t ld, int32_t* error,
                     cudaStream_t stream) {
  if (routes <= 0) return Status::ok();
  if (routes > 0x7FFFFFFF) return Status::invalid("gather: too many routes");
  if (dtype != DType::kF32 && hidden % 8 == 0 && ld % 8 == 0 &&
      reinterpret_cast<uintptr_t>(input) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(x_perm) % 16 == 0) {
    // 16-byte pieces; 128 threads cover a 2048-wide row in two passes.
    const uint32_t mask = dtype == DType::kF16 ? 0x7C00u : 0x7F80u;
    gather16_kernel<<<static_cast<unsigned>(routes), 128, 0, stream>>>(
        static_cast<const uint4*>(input), mask | (mask << 16), hidden / 8, permuted_route, slots,
        static_cast<uint4*>(x_perm), ld / 8, error);
    QMOE_CUDA_CHECK_LAUNCH("gather16_kernel");
    return Status::ok();
  }
  gather_kernel<<<static_cast<unsigned>(routes), 256, 0, stream>>>(
      input, dtype, hidden, permuted_route, slots, x_perm, ld, error);
  QMOE_CUDA_CHECK_LAUNCH("gather_kernel");
  return Status::ok();
}

Status launch_activation(const ActivationArgs& a, cudaStream_t stream) {
  if (a.routes <= 0) return Status::ok();
  activation_kernel<<<static_cast<unsigned>(a.routes), 256, 0, stream>>>(a);
  QMOE_CUDA_CHECK_LAUNCH("activation_kernel");
  return Status::ok();
}

Status launch_finalize(const FinalizeArgs& a, cudaStream_t stream) {
  if (a.tokens <= 0) return Status::ok();
  if (a.tokens > 65535) {
    // Grid y is limited to 65535: run token chunks.
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 65535) {
      FinalizeArgs c = a;
      const int64_t n = a.tokens - t0 < 65535 ? a.tokens - t0 : 65535;
      c.tokens = n;
      c.route_position = a.route_position + t0 * a.slots;
      c.expert_ids = a.expert_ids + t0 * a.slots;
      c.weights = a.weights + t0 * a.slots;
      c.out = static_cast<char*>(a.out) + t0 * a.hidden * dtype_size(a.out_dtype);
      QMOE_RETURN_IF_ERROR(launch_finalize(c, stream));
    }
    return Status::ok();
  }
  if (a.slots > 4096) return Status::invalid("finalize: at most 4096 slots per token");
  const bool four =
      a.hidden % 4 == 0 && a.ldy % 4 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
  const int64_t per_block = four ? 512 : 128;  // 128 threads
  const dim3 grid(static_cast<unsigned>((a.hidden + per_block - 1) / per_block),
                  static_cast<unsigned>(a.tokens));
  QMOE_CUDA_TRY(launch_maybe_pdl(four ? &finalize_kernel<4> : &finalize_kernel<1>, grid, dim3(128),
                                 12 * static_cast<size_t>(a.slots), stream, a.pdl, a));
  QMOE_CUDA_CHECK_LAUNCH("finalize_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda

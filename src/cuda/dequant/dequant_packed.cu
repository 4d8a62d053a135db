// Dequantization of FP4 and FP8 weights from the decode kernels' packed copy (mma_pack.h), for the
// generic path when the layer keeps no other: a warp per (tile, chunk), each lane decoding its 16
// bytes (rows g and g + 8, SC K steps, four consecutive k per row and step) with the host's
// formula, (E2M1 * scale) * global for FP4, e4m3 * global (fp8) or e4m3 * scale (fp8_block) for
// FP8, so every value equals the one dequant.cu computes from ORT's layout. The tile-ordered
// scales are ORT's (8-bit for FP4; fp8_block's per packed row); the chunks past the packed K write
// the zero columns up to ld.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "core/numeric.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/dequant/dequant.h"

namespace qmoe::cuda {
namespace {

constexpr int kWarps = 4;

// Four consecutive results, rounded to the output type (nearest even, as dequant.cu).
template <typename T>
__device__ __forceinline__ void store4(T* out, const float v[4]) {
  if constexpr (std::is_same<T, float>::value) {
    *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    uint16_t h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[i] = std::is_same<T, __nv_bfloat16>::value ? num::f32_to_bf16(v[i]) : num::f32_to_f16(v[i]);
    }
    *reinterpret_cast<uint2*>(out) =
        make_uint2(h[0] | (uint32_t{h[1]} << 16), h[2] | (uint32_t{h[3]} << 16));
  }
}

// kCodes: MmaCodes (NVFP4, MXFP4 or FP8).
template <int kCodes, typename T>
__global__ void __launch_bounds__(kWarps * 32) dequant_packed_kernel(DequantArgs a) {
  constexpr bool kNv = kCodes == static_cast<int>(MmaCodes::kNvFp4);
  constexpr bool kFp8 = kCodes == static_cast<int>(MmaCodes::kFp8);
  constexpr int kSteps = kFp8 ? 2 : 4;  // K steps per chunk
  constexpr int kChunkK = 16 * kSteps;
  const int slot = blockIdx.y;
  const int i = a.first_group + slot;
  if (i >= *a.n_touched) return;
  const int64_t e = a.touched[i];
  const MmaPackShape& s = a.fc.packed;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t wchunks = (a.ld + kChunkK - 1) / kChunkK;  // chunks up to ld
  const int64_t items = s.tiles * wchunks;
  const int64_t nblk = kNv ? s.fp4_blocks : s.scale_blocks;
  int shift = kNv ? 4 : 5;  // 16 or 32 K per scale; fp8_block: its block
  if (kFp8) shift = s.block_size ? __ffs(s.block_size) - 1 : 30;
  const bool fp8_global = kFp8 && a.fc.packed_scales == nullptr;  // else scales per row or block
  const float glob = kFp8 && !fp8_global ? 1.0f : a.fc.global_scale[e];
  T* out = static_cast<T*>(a.out) + slot * a.slot_stride;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); it < items;
       it += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t m = it / wchunks, c = it - m * wchunks;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (c < s.chunks) {
      v = *reinterpret_cast<const uint4*>(a.fc.packed_words + e * s.words_per_expert() +
                                          (m * s.chunks + c) * 128 + lane * 4);
    }
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t pr = 16 * m + g + 8 * rr;
      const int64_t plr = s.logical_row(pr);
      const int64_t lr = plr - a.fc.packed_row0;  // this FC's row
      if (plr < 0 || lr < 0 || lr >= a.fc.n) continue;
      const int64_t row_entry = ((e * s.tiles + m) * 16 + g + 8 * rr) * nblk;  // tile order
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const int64_t k0 = kChunkK * c + 16 * st + 4 * t;
        if (k0 >= a.ld) continue;
        float val[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // k0 + q: pair j = rr + 2 (q / 2), half q % 2
          const int j = rr + 2 * (q >> 1);
          const int64_t k = k0 + q;
          val[q] = 0.0f;
          if constexpr (kFp8) {  // pair 4 st + j: word 2 st + j / 2, its pair j % 2 (= rr)
            const unsigned code = mma_fp8_code(w[2 * st + (j >> 1)], s.fp8_mag_bit, rr, q & 1);
            if (k < s.k) {
              const float sv = fp8_global ? glob
                                          : load_scalar(a.fc.packed_scales, a.fc.format.scale_dtype,
                                                        row_entry + (k >> shift));
              val[q] = num::e4m3_to_f32(static_cast<uint8_t>(code)) * sv;
            }
          } else if (k < s.k) {
            const unsigned code = mma_fp4_code(w[st], s.fp4_mag_bit, j, q & 1);
            const uint8_t sc = a.fc.packed_scales[row_entry + (k >> shift)];
            const float sv = kNv ? num::e4m3_to_f32(sc) : num::e8m0_to_f32(sc);
            val[q] = (num::e2m1_to_f32(static_cast<uint8_t>(code)) * sv) * glob;
          }
        }
        store4(out + lr * a.ld + k0, val);
      }
    }
  }
}

template <int kCodes>
Status launch_typed(const DequantArgs& a, dim3 grid, cudaStream_t stream) {
  switch (a.out_dtype) {
    case DType::kBF16:
      dequant_packed_kernel<kCodes, __nv_bfloat16><<<grid, kWarps * 32, 0, stream>>>(a);
      break;
    case DType::kF16:
      dequant_packed_kernel<kCodes, __half><<<grid, kWarps * 32, 0, stream>>>(a);
      break;
    default:
      dequant_packed_kernel<kCodes, float><<<grid, kWarps * 32, 0, stream>>>(a);
      break;
  }
  QMOE_CUDA_CHECK_LAUNCH("dequant_packed_kernel");
  return Status::ok();
}

}  // namespace

Status launch_dequant_packed(const DequantArgs& a, cudaStream_t stream) {
  const DeviceFc& f = a.fc;
  const MmaPackShape& s = f.packed;
  // FP4 has block scales and a global scale; fp8 a global scale only; fp8_block scales only.
  const bool fp8 = s.codes == MmaCodes::kFp8;
  const bool needs_scales = !fp8 || s.block_size != 0;
  const bool needs_global = !fp8 || (s.block_size == 0 && f.packed_scales == nullptr);
  if (s.codes == MmaCodes::kInt || f.packed_row0 < 0 || f.packed_row0 + f.n > s.n ||
      (s.codes != MmaCodes::kFp8 && s.n != f.n) || s.k != f.k ||
      (needs_scales && f.packed_scales == nullptr) || (needs_global && f.global_scale == nullptr) ||
      a.ld % 8 != 0 || a.ld < f.k) {
    return Status::invalid(
        "dequant: a packed FC must be FP4 or FP8 with its shape's k, its rows inside the shape's "
        "(FP4: all of them), its scales and global scale, and ld a multiple of 8 >= k");
  }
  const int64_t chunk_k = 16 * s.steps_per_chunk;
  const int64_t items = s.tiles * ((a.ld + chunk_k - 1) / chunk_k);
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  const dim3 grid(static_cast<unsigned>(blocks < 65535 ? blocks : 65535),
                  static_cast<unsigned>(a.max_groups));
  switch (s.codes) {
    case MmaCodes::kNvFp4:
      return launch_typed<static_cast<int>(MmaCodes::kNvFp4)>(a, grid, stream);
    case MmaCodes::kMxFp4:
      return launch_typed<static_cast<int>(MmaCodes::kMxFp4)>(a, grid, stream);
    default:
      return launch_typed<static_cast<int>(MmaCodes::kFp8)>(a, grid, stream);
  }
}

}  // namespace qmoe::cuda

// Dequantization kernels: one thread decodes eight consecutive weights of a row (k0 % 8 == 0), so
// every integer width reads whole bytes (8 codes of b bits are b bytes), FP4 reads one 32-bit word,
// and the eight results leave in one 16-byte (bf16/f16) or two 16-byte (f32) stores. The block
// scale and zero point are loaded once per eight weights: blocks hold at least 16 codes.
#include <string>
#include <type_traits>

#include "core/formats/codec.h"
#include "core/numeric.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/dequant/dequant.h"

namespace qmoe::cuda {
namespace {

using formats::packed_bytes;
using formats::read_bits;

// Integer formats: w = float(q - zp) * scale (one rounding, as on the host). Blocks are powers of
// two, so block indices are shifts (block_shift < 0: one scale per row).
template <int kBits>
__device__ void decode_int(const DeviceFc& f, int block_shift, int64_t e, int64_t n, int k0,
                           float v[8]) {
  const int K = static_cast<int>(f.k);
  const uint8_t* codes = f.weight + (e * f.n + n) * packed_bytes(K, kBits);
  const int blocks = block_shift < 0 ? 1 : K >> block_shift;
  const int blk = block_shift < 0 ? 0 : k0 >> block_shift;  // the eight weights share one block
  const float s = load_scalar(f.scales, f.format.scale_dtype, (e * f.n + n) * blocks + blk);
  int zp = 1 << (kBits - 1);
  if (f.zero_points != nullptr) {
    zp = block_shift >= 0
             ? static_cast<int>(read_bits(
                   f.zero_points + (e * f.n + n) * packed_bytes(blocks, kBits), blk, kBits))
             : static_cast<int>(read_bits(f.zero_points + e * packed_bytes(f.n, kBits), n, kBits));
  }
  if (k0 + 8 <= K) {
    const uint8_t* p = codes + k0 * kBits / 8;
    uint64_t word = 0;
#pragma unroll
    for (int i = 0; i < kBits; ++i) word |= static_cast<uint64_t>(p[i]) << (8 * i);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int q = static_cast<int>((word >> (kBits * i)) & ((1u << kBits) - 1u));
      v[i] = static_cast<float>(q - zp) * s;
    }
  } else {  // the tail of a per-channel row whose K is not a multiple of 8
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int k = k0 + i;
      v[i] =
          k < K ? static_cast<float>(static_cast<int>(read_bits(codes, k, kBits)) - zp) * s : 0.0f;
    }
  }
}

// FP4 (K-packed): w = (e2m1(code) * block_scale) * global. K is a multiple of the block (16 or 32).
template <int kBlock>
__device__ void decode_fp4(const DeviceFc& f, int64_t e, int64_t n, int k0, float v[8]) {
  const int K = static_cast<int>(f.k);
  const uint8_t* p = f.weight + (e * f.n + n) * (K / 2) + k0 / 2;
  const uint32_t word = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                        (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  const float s =
      load_scalar(f.scales, f.format.scale_dtype, (e * f.n + n) * (K / kBlock) + k0 / kBlock);
  const float g = f.global_scale[e];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = (num::e2m1_to_f32(static_cast<uint8_t>((word >> (4 * i)) & 15u)) * s) * g;
  }
}

// FP8: w = e4m3(code) * global (fp8) or * scale[n / bs, k / bs] (fp8_block, partial edge blocks).
template <bool kBlocked>
__device__ void decode_fp8(const DeviceFc& f, int64_t e, int64_t n, int64_t k0, float v[8]) {
  const int64_t K = f.k;
  const uint8_t* p = f.weight + (e * f.n + n) * K;
  if constexpr (!kBlocked) {
    const float g = f.global_scale[e];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = k0 + i < K ? num::e4m3_to_f32(p[k0 + i]) * g : 0.0f;
  } else {
    const int64_t bs = f.format.block_size;
    const int64_t nbk = (K + bs - 1) / bs;
    const int64_t first = (e * ((f.n + bs - 1) / bs) + n / bs) * nbk;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t k = k0 + i;
      v[i] = k < K ? num::e4m3_to_f32(p[k]) *
                         load_scalar(f.scales, f.format.scale_dtype, first + k / bs)
                   : 0.0f;
    }
  }
}

template <WeightFormat F>
__device__ __forceinline__ void decode8(const DeviceFc& f, int block_shift, int64_t e, int64_t n,
                                        int k0, float v[8]) {
  if constexpr (F == WeightFormat::kInt2) decode_int<2>(f, block_shift, e, n, k0, v);
  if constexpr (F == WeightFormat::kInt3) decode_int<3>(f, block_shift, e, n, k0, v);
  if constexpr (F == WeightFormat::kInt4) decode_int<4>(f, block_shift, e, n, k0, v);
  if constexpr (F == WeightFormat::kInt8) decode_int<8>(f, block_shift, e, n, k0, v);
  if constexpr (F == WeightFormat::kNvFp4) decode_fp4<16>(f, e, n, k0, v);
  if constexpr (F == WeightFormat::kMxFp4) decode_fp4<32>(f, e, n, k0, v);
  if constexpr (F == WeightFormat::kFp8) decode_fp8<false>(f, e, n, k0, v);
  if constexpr (F == WeightFormat::kFp8Block) decode_fp8<true>(f, e, n, k0, v);
}

// Eight results to out[0, 8): the host's round-to-nearest-even conversions, so a bf16/f16 scratch
// holds exactly the rounded fp32 weights.
template <typename OutT>
__device__ __forceinline__ void store8(OutT* out, const float v[8]);
template <>
__device__ __forceinline__ void store8<float>(float* out, const float v[8]) {
  reinterpret_cast<float4*>(out)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(out)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

struct Bf16Tag {};
struct F16Tag {};

template <typename Tag>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same<Tag, Bf16Tag>::value) {
    return static_cast<uint32_t>(num::f32_to_bf16(a)) |
           (static_cast<uint32_t>(num::f32_to_bf16(b)) << 16);
  } else {
    return static_cast<uint32_t>(num::f32_to_f16(a)) |
           (static_cast<uint32_t>(num::f32_to_f16(b)) << 16);
  }
}

constexpr int kWarps = 8;

// A warp per row (rows strided over the grid), lanes over the row's eight-weight chunks: reads
// and writes are coalesced, and no index needs a division.
template <WeightFormat F, typename Tag>
__global__ void __launch_bounds__(kWarps * 32) dequant_kernel(DequantArgs a, int block_shift) {
  const int slot = blockIdx.y;
  const int i = a.first_group + slot;
  if (i >= *a.n_touched) return;
  const int64_t e = a.touched[i];
  const int chunks = static_cast<int>(a.ld / 8);
  const int K = static_cast<int>(a.fc.k);
  const int lane = threadIdx.x & 31;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); n < a.fc.n;
       n += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t row = slot * a.slot_stride + n * a.ld;
    for (int c = lane; c < chunks; c += 32) {
      const int k0 = c * 8;
      float v[8];
      if (k0 < K) {
        decode8<F>(a.fc, block_shift, e, n, k0, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = 0.0f;
      }
      if constexpr (std::is_same<Tag, float>::value) {
        store8<float>(static_cast<float*>(a.out) + row + k0, v);
      } else {
        const uint4 q = make_uint4(pack2<Tag>(v[0], v[1]), pack2<Tag>(v[2], v[3]),
                                   pack2<Tag>(v[4], v[5]), pack2<Tag>(v[6], v[7]));
        *reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.out) + row + k0) = q;
      }
    }
  }
}

template <WeightFormat F>
Status launch_for_format(const DequantArgs& a, dim3 grid, cudaStream_t stream) {
  // Integer blocks are powers of two in [16, 256] (check_fc_format); per channel: -1.
  int shift = -1;
  if (a.fc.format.info().kind == FormatKind::kInteger && a.fc.format.block_size > 0) {
    shift = 0;
    while ((1 << shift) < a.fc.format.block_size) ++shift;
  }
  switch (a.out_dtype) {
    case DType::kBF16:
      dequant_kernel<F, Bf16Tag><<<grid, kWarps * 32, 0, stream>>>(a, shift);
      break;
    case DType::kF16:
      dequant_kernel<F, F16Tag><<<grid, kWarps * 32, 0, stream>>>(a, shift);
      break;
    default:
      dequant_kernel<F, float><<<grid, kWarps * 32, 0, stream>>>(a, shift);
      break;
  }
  QMOE_CUDA_CHECK_LAUNCH("dequant_kernel");
  return Status::ok();
}

}  // namespace

Status launch_dequant(const DequantArgs& a, cudaStream_t stream) {
  const DeviceFc& f = a.fc;
  if (a.out_dtype != DType::kBF16 && a.out_dtype != DType::kF16 && a.out_dtype != DType::kF32) {
    return Status::invalid(std::string("dequant out_dtype: expected bf16, f16 or f32, got ") +
                           dtype_name(a.out_dtype));
  }
  if (f.n <= 0 || f.k <= 0) {
    return Status::invalid("dequant fc: expected n, k > 0, got n " + std::to_string(f.n) + ", k " +
                           std::to_string(f.k));
  }
  if (a.ld < f.k || a.ld % 8 != 0) {
    return Status::invalid("dequant ld: expected a multiple of 8 >= k (" + std::to_string(f.k) +
                           "), got " + std::to_string(a.ld));
  }
  if (a.slot_stride < f.n * a.ld) {
    return Status::invalid("dequant slot_stride: expected >= n * ld (" +
                           std::to_string(f.n * a.ld) + "), got " + std::to_string(a.slot_stride));
  }
  if (a.max_groups <= 0 || a.max_groups > 65535 || a.first_group < 0) {
    return Status::invalid("dequant max_groups: expected 1..65535 and first_group >= 0, got " +
                           std::to_string(a.max_groups) + ", " + std::to_string(a.first_group));
  }
  const bool needs_scales = f.format.format != WeightFormat::kFp8;
  const bool needs_global = f.format.info().global_scale_required;
  const bool packed = f.packed_words != nullptr;
  if ((!packed && f.weight == nullptr) || (needs_scales && !packed && f.scales == nullptr) ||
      (packed && needs_scales && f.packed_scales == nullptr) ||
      (needs_global && f.global_scale == nullptr) ||
      (f.format.zero_points && f.zero_points == nullptr) || a.out == nullptr ||
      a.touched == nullptr || a.n_touched == nullptr) {
    return Status::invalid(
        "dequant: null weight, scale, zero-point, global-scale, output or "
        "schedule pointer");
  }
  if (reinterpret_cast<uintptr_t>(a.out) % 16 != 0) {
    return Status::invalid("dequant out: expected a 16-byte aligned pointer");
  }
  if (f.k > (int64_t{1} << 24) || a.ld > (int64_t{1} << 24)) {
    return Status::invalid("dequant k, ld: expected at most 2^24");
  }
  if (packed) return launch_dequant_packed(a, stream);
  const int64_t blocks = (f.n + kWarps - 1) / kWarps;
  const dim3 grid(static_cast<unsigned>(blocks < 65535 ? blocks : 65535),
                  static_cast<unsigned>(a.max_groups));
  switch (f.format.format) {
#define QMOE_X(id, ...)  \
  case WeightFormat::id: \
    return launch_for_format<WeightFormat::id>(a, grid, stream);
    QMOE_WEIGHT_FORMATS(QMOE_X)
#undef QMOE_X
  }
  return Status::invalid("dequant format: unknown value");
}

}  // namespace qmoe::cuda

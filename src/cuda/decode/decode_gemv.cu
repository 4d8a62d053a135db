// The decode kernels (see decode_gemv.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "core/formats/codec.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/decode/decode_common.cuh"
#include "cuda/decode/decode_gemv.h"
#include "cuda/layer/activation.cuh"

namespace qmoe::cuda {
namespace {

using namespace decode_detail;

constexpr int kWarps = 4;  // split K
constexpr int kRing = 4;   // 16-byte weight loads in flight per lane

// One block: one 16-row tile of one touched expert, its (up to 8) routes staged in shared memory
// (row stride K + 8 halves, so the 8 rows of a fragment load fall in different banks); 4 warps
// split K. The weight loads and the first scales are issued before the staging wait, so their
// latencies overlap. Indices inside a row are 32-bit (launch checks K against the staging limit).
template <int kBits, bool kBf16>
__global__ void __launch_bounds__(kWarps * 32) decode_fc_kernel(DecodeFcArgs a) {
  constexpr int kSteps = 16 / kBits;  // K steps per 16-byte chunk
  constexpr int kPairsPerWord = 16 / kBits;
  extern __shared__ __align__(16) uint16_t xs[];  // [8][K + 8]
  __shared__ float red[kWarps][4][32];

  if (a.fc1) {  // the touched list and the maps come from the routing just before
    pdl_wait();
    pdl_trigger();
  }
  const int gi = blockIdx.y;
  if (gi >= *a.n_touched) return;
  const int64_t e = a.touched[gi];
  const int off = a.offsets[e];
  const int cnt = a.offsets[e + 1] - off;
  const int m = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const MmaPackShape& s = a.shape;
  const int64_t N = s.n;
  const int K = static_cast<int>(s.k);
  const int xs_ld = K + 8;
  const int chunks = static_cast<int>(s.chunks);

  // 1. This warp's weight chunks: the first kRing loads go out now.
  const int c0 = chunks * warp / kWarps, c1 = chunks * (warp + 1) / kWarps;
  const uint32_t* wbase =
      a.packed + e * s.words_per_expert() + static_cast<int64_t>(m) * chunks * 128 + lane * 4;
  uint4 ring[kRing];
#pragma unroll
  for (int i = 0; i < kRing; ++i) {
    if (c0 + i < c1) ring[i] = load_stream(wbase + (c0 + i) * 128);
  }

  // 2. The lane's two A rows and the scales and zero points of its first two blocks.
  const int64_t lr0 = s.logical_row(16 * m + g), lr1 = s.logical_row(16 * m + g + 8);
  const int blocks = a.block_size ? K / a.block_size : 1;
  int shift = 0;
  while (a.block_size && (1 << shift) < a.block_size) ++shift;
  const float base = kBf16 ? 128.0f : 1024.0f;
  const float mid = static_cast<float>(1 << (kBits - 1));
  auto scale_of = [&](int64_t lr, int blk) {
    return lr < 0 || blk >= blocks
               ? 0.0f
               : load_scalar(a.scales, a.scale_dtype, (e * N + lr) * blocks + blk);
  };
  auto zp_of = [&](int64_t lr, int blk) {
    if (lr < 0 || a.zero_points == nullptr || blk >= blocks) return mid;
    const unsigned z =
        a.block_size
            ? formats::read_bits(
                  a.zero_points + (e * N + lr) * formats::packed_bytes(blocks, kBits), blk, kBits)
            : formats::read_bits(a.zero_points + e * formats::packed_bytes(N, kBits), lr, kBits);
    return static_cast<float>(z);
  };
  int cur_blk = a.block_size ? (16 * c0 * kSteps) >> shift : 0;
  float s0 = scale_of(lr0, cur_blk), s1 = scale_of(lr1, cur_blk);
  float z0 = zp_of(lr0, cur_blk), z1 = zp_of(lr1, cur_blk);
  float ns0 = scale_of(lr0, cur_blk + 1), ns1 = scale_of(lr1, cur_blk + 1);
  float nz0 = zp_of(lr0, cur_blk + 1), nz1 = zp_of(lr1, cur_blk + 1);

  if (!a.fc1) {  // FC2's activations are FC1's output
    pdl_wait();
    pdl_trigger();
  }

  // 3. Stage the routes' rows, four independent 16-byte loads in flight per thread. Tile 0's
  //    blocks see every activation of their routes: they check them for inf/nan.
  const bool check = a.error != nullptr && m == 0;
  const uint32_t exp_mask = kBf16 ? 0x7F807F80u : 0x7C007C00u;
  auto nonfinite = [&](uint32_t v) {
    return (v & (exp_mask & 0xFFFFu)) == (exp_mask & 0xFFFFu) ||
           (v & (exp_mask & 0xFFFF0000u)) == (exp_mask & 0xFFFF0000u);
  };
  {
    const int pieces = K / 8;
    const int total = cnt * pieces;
    for (int i0 = threadIdx.x; i0 < total; i0 += 4 * blockDim.x) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = i0 + u * blockDim.x;
        if (i < total) {
          const int r = i / pieces;
          const int p = off + r;
          const int64_t row = a.by_token ? a.permuted_route[p] / a.slots : p;
          v[u] = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) +
                                                      row * a.ldx + (i - r * pieces) * 8));
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int i = i0 + u * blockDim.x;
        if (i < total) {
          const int r = i / pieces;
          if (check &&
              (nonfinite(v[u].x) || nonfinite(v[u].y) || nonfinite(v[u].z) || nonfinite(v[u].w))) {
            atomicOr(a.error, 4);
            atomicMin(a.error + 1, a.permuted_route[off + r] / a.slots);
          }
          *reinterpret_cast<uint4*>(xs + r * xs_ld + (i - r * pieces) * 8) = v[u];
        }
      }
    }
  }
  __syncthreads();

  // 4. The main loop: per K step, decode 4 A registers, one mma with the staged B.
  const bool has_x = g < cnt;  // absent routes read nothing: their B column is 0
  const int xoff = g * xs_ld + 4 * t;
  const int k_steps = K / 16;
  uint32_t sub0 = pair_of<kBf16>(base + z0), sub1 = pair_of<kBf16>(base + z1);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto flush = [&]() {
    acc[0] = fmaf(s0, blk[0], acc[0]);
    acc[1] = fmaf(s0, blk[1], acc[1]);
    acc[2] = fmaf(s1, blk[2], acc[2]);
    acc[3] = fmaf(s1, blk[3], acc[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) blk[i] = 0.0f;
  };
  auto process = [&](const uint4& wv, int c) {
    const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int sc = 0; sc < kSteps; ++sc) {
      const int step = c * kSteps + sc;
      if (step < k_steps) {
        const int b = a.block_size ? (16 * step) >> shift : 0;
        if (b != cur_blk) {  // blocks advance one at a time within a warp's range
          flush();
          cur_blk = b;
          s0 = ns0, s1 = ns1, z0 = nz0, z1 = nz1;
          sub0 = pair_of<kBf16>(base + z0);
          sub1 = pair_of<kBf16>(base + z1);
          ns0 = scale_of(lr0, b + 1), ns1 = scale_of(lr1, b + 1);
          nz0 = zp_of(lr0, b + 1), nz1 = zp_of(lr1, b + 1);
        }
        uint32_t af[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int pair = 4 * sc + j;
          const uint32_t v = w[pair / kPairsPerWord] >> (kBits * (pair % kPairsPerWord));
          af[j] = codes_to_pair<kBits, kBf16>(v, (j & 1) ? sub1 : sub0, (j & 1) ? z1 : z0);
        }
        uint2 bv = make_uint2(0u, 0u);
        if (has_x) bv = *reinterpret_cast<const uint2*>(xs + xoff + 16 * step);
        mma16816<kBf16>(blk, af, bv.x, bv.y);
      }
    }
  };
  for (int c = c0; c < c1; c += kRing) {
#pragma unroll
    for (int i = 0; i < kRing; ++i) {
      if (c + i < c1) {
        const uint4 wv = ring[i];
        if (c + i + kRing < c1) ring[i] = load_stream(wbase + (c + i + kRing) * 128);
        process(wv, c + i);
      }
    }
  }
  flush();

  // 5. The 4 warps' partial sums, added in warp order by warp 0, then the epilogue.
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float sum = red[0][i][lane];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) sum = sum + red[w][i][lane];
    v[i] = sum;
  }
  epilogue(a, e, m, g, lr0, lr1, off, cnt, 2 * t, v, kBf16);
}

template <int kBits, bool kBf16>
Status launch_typed(const DecodeFcArgs& a, dim3 grid, int max_routes, cudaStream_t stream) {
  // Up to 8 routes per expert: a variant reading activations from L1/L2 step by step for more
  // routes measured slower than the generic path (789 us at 16 tokens for qwen3-30b-a3b INT4),
  // so the dispatch sends those calls to the generic path.
  const size_t smem = static_cast<size_t>(8 * (a.shape.k + 8) * 2);
  auto* kernel = &decode_fc_kernel<kBits, kBf16>;
  if (smem > 48 * 1024) {
    QMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  QMOE_CUDA_TRY(launch_maybe_pdl(kernel, grid, dim3(kWarps * 32), smem, stream, a.pdl, a));
  QMOE_CUDA_CHECK_LAUNCH("decode_fc_kernel");
  return Status::ok();
}

template <int kBits>
Status launch_bits(const DecodeFcArgs& a, dim3 grid, int max_routes, cudaStream_t stream) {
  return a.dtype == DType::kBF16 ? launch_typed<kBits, true>(a, grid, max_routes, stream)
                                 : launch_typed<kBits, false>(a, grid, max_routes, stream);
}

}  // namespace

Status check_decode_args(const DecodeFcArgs& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kF16) {
    return Status::invalid(std::string("decode dtype: expected bf16 or f16, got ") +
                           dtype_name(a.dtype));
  }
  if (a.packed == nullptr || a.scales == nullptr || a.x == nullptr || a.out == nullptr ||
      a.touched == nullptr || a.n_touched == nullptr || a.offsets == nullptr ||
      (a.by_token && a.permuted_route == nullptr) ||
      (a.scale_input && (a.weights == nullptr || a.permuted_route == nullptr))) {
    return Status::invalid("decode: null weight, scale, activation, output or schedule pointer");
  }
  if (a.shape.k % 16 != 0 || a.ldx % 8 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return Status::invalid(
        "decode: K must be a multiple of 16 and activation rows 16-byte aligned");
  }
  if (a.max_groups <= 0 || a.max_groups > 65535 || a.shape.tiles <= 0 ||
      a.shape.tiles > 0x7FFFFFFF || a.shape.k > (int64_t{1} << 24)) {
    return Status::invalid("decode: max_groups must be 1..65535, tiles positive, K <= 2^24");
  }
  return Status::ok();
}

Status launch_decode_fc(const DecodeFcArgs& a, int max_routes, cudaStream_t stream) {
  QMOE_RETURN_IF_ERROR(check_decode_args(a));
  if (max_routes < 1 || max_routes > kDecodeMaxRoutes) {  // the staged kernel's 8 columns
    return Status::invalid("decode: max_routes must be 1.." + std::to_string(kDecodeMaxRoutes) +
                           ", got " + std::to_string(max_routes));
  }
  if (8 * (a.shape.k + 8) * 2 > 200 * 1024) {
    return Status::invalid("decode: K too large to stage 8 activation rows in shared memory");
  }
  const dim3 grid(static_cast<unsigned>(a.shape.tiles), static_cast<unsigned>(a.max_groups));
  switch (a.shape.bits) {
    case 2:
      return launch_bits<2>(a, grid, max_routes, stream);
    case 4:
      return launch_bits<4>(a, grid, max_routes, stream);
    case 8:
      return launch_bits<8>(a, grid, max_routes, stream);
    default:
      return Status::invalid("decode: bits must be 2, 4 or 8, got " + std::to_string(a.shape.bits));
  }
}

}  // namespace qmoe::cuda

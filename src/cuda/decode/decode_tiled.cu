// The decode kernel for calls of 9..64 tokens (see decode_gemv.h): up to 64 routes per expert, so
// the activations no longer fit shared memory whole. A block owns 4 consecutive 16-row tiles of
// one touched expert (a warp each, full K, no cross-warp sum) and walks K in slices of kSlice:
// the block stages the slice of every route's activation row, then each warp streams its tile's
// codes for that slice and multiplies them with up to kMC groups of 8 routes (one mma each per K
// step), so each touched expert's weights are still read once per call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "core/formats/codec.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/decode/decode_common.cuh"
#include "cuda/decode/decode_gemv.h"

namespace qmoe::cuda {
namespace {

using namespace decode_detail;

constexpr int kTilesPerBlock = 4;  // one warp per tile
constexpr int kSlice = 256;        // K staged at a time

template <int kBits, bool kBf16, int kMC>
__global__ void __launch_bounds__(kTilesPerBlock * 32) decode_tiled_kernel(DecodeFcArgs a) {
  constexpr int kSteps = 16 / kBits;  // K steps per 16-byte chunk
  constexpr int kPairsPerWord = 16 / kBits;
  constexpr int kChunkK = 16 * kSteps;
  constexpr int kChunksPerSlice = kSlice / kChunkK;  // also the ring: slot = chunk in slice
  constexpr int kLd = kSlice + 8;                    // halves; +8 spreads the rows over banks
  extern __shared__ __align__(16) uint16_t xs[];     // [8 kMC][kLd]

  if (a.fc1) {  // the touched list and the maps come from the routing just before
    pdl_wait();
    pdl_trigger();
  }
  const int gi = blockIdx.y;
  if (gi >= *a.n_touched) return;
  const int64_t e = a.touched[gi];
  const int off = a.offsets[e];
  const int cnt = a.offsets[e + 1] - off;
  const int nch = (cnt + 7) / 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const MmaPackShape& s = a.shape;
  const int64_t N = s.n;
  const int K = static_cast<int>(s.k);
  const int chunks = static_cast<int>(s.chunks);
  const int k_steps = K / 16;
  const int m = blockIdx.x * kTilesPerBlock + warp;
  const bool active = m < s.tiles;  // warp-uniform; an idle warp still joins the barriers

  // The first slice's weight chunks go out before anything waits.
  const uint32_t* wbase =
      a.packed + e * s.words_per_expert() + static_cast<int64_t>(m) * chunks * 128 + lane * 4;
  uint4 ring[kChunksPerSlice];
#pragma unroll
  for (int i = 0; i < kChunksPerSlice; ++i) {
    if (active && i < chunks) ring[i] = load_stream(wbase + i * 128);
  }

  const int64_t lr0 = active ? s.logical_row(16 * m + g) : -1;
  const int64_t lr1 = active ? s.logical_row(16 * m + g + 8) : -1;
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
  int cur_blk = 0;
  float s0 = scale_of(lr0, 0), s1 = scale_of(lr1, 0);
  float z0 = zp_of(lr0, 0), z1 = zp_of(lr1, 0);
  float ns0 = scale_of(lr0, 1), ns1 = scale_of(lr1, 1);
  float nz0 = zp_of(lr0, 1), nz1 = zp_of(lr1, 1);
  uint32_t sub0 = pair_of<kBf16>(base + z0), sub1 = pair_of<kBf16>(base + z1);

  float acc[kMC][4], blk[kMC][4];
#pragma unroll
  for (int ch = 0; ch < kMC; ++ch) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[ch][i] = blk[ch][i] = 0.0f;
  }
  auto flush = [&]() {
#pragma unroll
    for (int ch = 0; ch < kMC; ++ch) {
      if (ch < nch) {
        acc[ch][0] = fmaf(s0, blk[ch][0], acc[ch][0]);
        acc[ch][1] = fmaf(s0, blk[ch][1], acc[ch][1]);
        acc[ch][2] = fmaf(s1, blk[ch][2], acc[ch][2]);
        acc[ch][3] = fmaf(s1, blk[ch][3], acc[ch][3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) blk[ch][i] = 0.0f;
      }
    }
  };
  auto process = [&](const uint4& wv, int c, int k0) {
    const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
    for (int sc = 0; sc < kSteps; ++sc) {
      const int step = c * kSteps + sc;
      if (step < k_steps) {
        const int b = a.block_size ? (16 * step) >> shift : 0;
        if (b != cur_blk) {  // blocks advance one at a time
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
        const int col = 16 * step - k0 + 4 * t;
#pragma unroll
        for (int ch = 0; ch < kMC; ++ch) {
          if (ch < nch) {
            uint2 bv = make_uint2(0u, 0u);
            if (8 * ch + g < cnt) {
              bv = *reinterpret_cast<const uint2*>(xs + (8 * ch + g) * kLd + col);
            }
            mma16816<kBf16>(blk[ch], af, bv.x, bv.y);
          }
        }
      }
    }
  };

  const bool check = a.error != nullptr && blockIdx.x == 0;
  const uint32_t exp_mask = kBf16 ? 0x7F807F80u : 0x7C007C00u;
  auto nonfinite = [&](uint32_t v) {
    return (v & (exp_mask & 0xFFFFu)) == (exp_mask & 0xFFFFu) ||
           (v & (exp_mask & 0xFFFF0000u)) == (exp_mask & 0xFFFF0000u);
  };
  if (!a.fc1) {  // FC2's activations are FC1's output
    pdl_wait();
    pdl_trigger();
  }
  for (int k0 = 0; k0 < K; k0 += kSlice) {
    __syncthreads();  // every warp is done with the previous slice
    const int pieces = min(kSlice, K - k0) / 8;
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
                                                      row * a.ldx + k0 + (i - r * pieces) * 8));
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
          *reinterpret_cast<uint4*>(xs + r * kLd + (i - r * pieces) * 8) = v[u];
        }
      }
    }
    __syncthreads();
    if (active) {
#pragma unroll
      for (int i = 0; i < kChunksPerSlice; ++i) {
        const int c = k0 / kChunkK + i;
        if (c < chunks) {
          const uint4 wv = ring[i];
          if (c + kChunksPerSlice < chunks) {
            ring[i] = load_stream(wbase + (c + kChunksPerSlice) * 128);
          }
          process(wv, c, k0);
        }
      }
    }
  }
  if (!active) return;
  flush();
#pragma unroll
  for (int ch = 0; ch < kMC; ++ch) {
    if (ch < nch) epilogue(a, e, m, g, lr0, lr1, off, cnt, 8 * ch + 2 * t, acc[ch], kBf16);
  }
}

template <int kBits, bool kBf16, int kMC>
Status launch_mc(const DecodeFcArgs& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.shape.tiles + kTilesPerBlock - 1) / kTilesPerBlock),
                  static_cast<unsigned>(a.max_groups));
  const size_t smem = static_cast<size_t>(8 * kMC) * (kSlice + 8) * 2;
  QMOE_CUDA_TRY(launch_maybe_pdl(&decode_tiled_kernel<kBits, kBf16, kMC>, grid,
                                 dim3(kTilesPerBlock * 32), smem, stream, a.pdl, a));
  QMOE_CUDA_CHECK_LAUNCH("decode_tiled_kernel");
  return Status::ok();
}

template <int kBits, bool kBf16>
Status launch_typed(const DecodeFcArgs& a, int max_routes, cudaStream_t stream) {
  return max_routes <= 16 ? launch_mc<kBits, kBf16, 2>(a, stream)
                          : launch_mc<kBits, kBf16, 8>(a, stream);
}

template <int kBits>
Status launch_bits(const DecodeFcArgs& a, int max_routes, cudaStream_t stream) {
  return a.dtype == DType::kBF16 ? launch_typed<kBits, true>(a, max_routes, stream)
                                 : launch_typed<kBits, false>(a, max_routes, stream);
}

}  // namespace

Status launch_decode_fc_tiled(const DecodeFcArgs& a, int max_routes, cudaStream_t stream) {
  if (max_routes < 1 || max_routes > kDecodeTiledMaxRoutes) {
    return Status::invalid("decode (tiled): max_routes must be 1.." +
                           std::to_string(kDecodeTiledMaxRoutes) + ", got " +
                           std::to_string(max_routes));
  }
  QMOE_RETURN_IF_ERROR(check_decode_args(a));
  switch (a.shape.bits) {
    case 2:
      return launch_bits<2>(a, max_routes, stream);
    case 4:
      return launch_bits<4>(a, max_routes, stream);
    case 8:
      return launch_bits<8>(a, max_routes, stream);
    default:
      return Status::invalid("decode: bits must be 2, 4 or 8, got " + std::to_string(a.shape.bits));
  }
}

}  // namespace qmoe::cuda

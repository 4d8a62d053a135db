// The decode kernel (see decode_gemv.h), included once per code width by decode_b*.cu.
//
// Written for the HBM roofline at small token counts, where a block lives a few microseconds and
// every latency it serializes, and every instruction it issues, shows in the layer's time:
//   - the warp's weight loads (up to 6 or 8 16-byte loads per lane) are issued first; the tile's
//     scales, zero points and the routes' activations are then fetched in batches while those
//     are in flight, and staged in shared memory;
//   - the K loop has no bounds checks: the staged rows are zero past K up to whole chunks, and an
//     absent route's B fragment comes from a zero row;
//   - where scale blocks start is known at compile time (kSpb) for every width but int3, so the
//     loop only tests for a new block once per chunk when blocks span chunks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/formats/codec.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/decode/decode_common.cuh"
#include "cuda/decode/decode_gemv.h"
#include "cuda/decode/decode_launch.h"

namespace qmoe::cuda::decode_detail {

constexpr int kWarps = 4;  // split K inside the block
constexpr int kScaleBatch = 2;

// Shared memory: scales [16][nblk_pad] and zero points [16][nblk_pad] as fp32, a zero row [ld],
// the staged activations [rows_cap][ld].
template <int kBits, bool kBf16, int kMC, int kSpb>
__global__ void __launch_bounds__(kWarps * 32, kMC == 1 ? 6 : 4)
    decode_fc_kernel(DecodeFcArgs a, DecodeGeometry geo) {
  constexpr int kSteps = 16 / kBits;  // K steps per 16-byte chunk (int3: 5 pairs per half word)
  constexpr int kPairsPerWord = 16 / kBits;
  constexpr int kChunkK = 16 * kSteps;
  // 16-byte weight loads in flight per lane. One column group runs 6 blocks per SM (80 registers:
  // 6 x 16 bytes per lane leave no spills), two run 4 with 8 loads each.
  constexpr int kRing = kMC == 1 ? 6 : 8;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[kWarps - 1][kMC][4][32];
  const int nbp = geo.nblk_pad;
  const bool has_zp = a.zero_points != nullptr;
  float* sc = reinterpret_cast<float*>(smem);
  float* zs = sc + 16 * nbp;
  uint16_t* zrow = reinterpret_cast<uint16_t*>(zs + (has_zp ? 16 * nbp : 0));
  uint16_t* xs = zrow + geo.ld;
  const int tid = static_cast<int>(threadIdx.x);

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
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const MmaPackShape& s = a.shape;
  const int chunks = static_cast<int>(s.chunks);

  // 1. The warp's weight chunks, all of them up to kRing, go out now.
  const int c0 = chunks * warp / kWarps, c1 = chunks * (warp + 1) / kWarps;
  const uint32_t* wbase =
      a.packed + e * s.words_per_expert() + static_cast<int64_t>(m) * chunks * 128 + lane * 4;
  uint4 ring[kRing];
  auto fill_ring = [&]() {
#pragma unroll
    for (int i = 0; i < kRing; ++i) {
      if (c0 + i < c1) ring[i] = load_stream(wbase + (c0 + i) * 128);
    }
  };
  fill_ring();

  // 2. The zero row, and the tile's scales and zero points (kScaleBatch loads in flight per
  //    thread; the weight ring is live, so more would spill).
  for (int i = tid; i < geo.ld / 8; i += kWarps * 32) {
    reinterpret_cast<uint4*>(zrow)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  const float mid = static_cast<float>(1 << (kBits - 1));
  const int nsc = 16 * nbp;
  for (int i0 = tid; i0 < nsc; i0 += kScaleBatch * kWarps * 32) {
    float v[kScaleBatch], z[kScaleBatch];
#pragma unroll
    for (int u = 0; u < kScaleBatch; ++u) {
      const int i = i0 + u * kWarps * 32;
      v[u] = 0.0f;
      z[u] = mid;
      if (i < nsc) {
        const int pr = i / nbp, b = i - pr * nbp;
        const int64_t lr = s.logical_row(16 * m + pr);
        if (lr >= 0 && b < geo.nblk) {
          v[u] = load_scalar(a.scales, a.scale_dtype, (e * s.n + lr) * geo.nblk + b);
          if (has_zp) {
            const unsigned q =
                a.block_size
                    ? formats::read_bits(
                          a.zero_points + (e * s.n + lr) * formats::packed_bytes(geo.nblk, kBits),
                          b, kBits)
                    : formats::read_bits(a.zero_points + e * formats::packed_bytes(s.n, kBits), lr,
                                         kBits);
            z[u] = static_cast<float>(q);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kScaleBatch; ++u) {
      const int i = i0 + u * kWarps * 32;
      if (i < nsc) {
        sc[i] = v[u];
        if (has_zp) zs[i] = z[u];
      }
    }
  }

  if (!a.fc1) {  // FC2's activations are FC1's output
    pdl_wait();
    pdl_trigger();
  }

  const int64_t lr0 = s.logical_row(16 * m + g), lr1 = s.logical_row(16 * m + g + 8);
  const float base = kBf16 ? 128.0f : 1024.0f;
  const bool check = a.error != nullptr && m == 0;  // tile 0 sees every activation of its routes
  const uint32_t exp_mask = kBf16 ? 0x7F807F80u : 0x7C007C00u;
  auto nonfinite = [&](uint32_t v) {
    return (v & (exp_mask & 0xFFFFu)) == (exp_mask & 0xFFFFu) ||
           (v & (exp_mask & 0xFFFF0000u)) == (exp_mask & 0xFFFF0000u);
  };
  const int pieces = geo.kpad / 8, real_pieces = static_cast<int>(s.k) / 8;
  const int bs_mask = (1 << geo.shift) - 1;

  for (int p0 = 0; p0 < cnt; p0 += geo.rows_cap) {
    const int rows = min(geo.rows_cap, cnt - p0);
    if (p0 > 0) {  // another pass: the weights again (mostly from L2), after every warp is done
      __syncthreads();
      fill_ring();
    }
    // 3. Stage the pass's activation rows (zeros past K), two 16-byte loads in flight per thread
    //    (the weight ring is live here: more would spill).
    const int total = rows * pieces;
    for (int i0 = tid; i0 < total; i0 += 2 * kWarps * 32) {
      uint4 v[2];
      int dst[2];
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int i = i0 + u * kWarps * 32;
        dst[u] = -1;
        v[u] = make_uint4(0u, 0u, 0u, 0u);
        if (i < total) {
          const int r = i / pieces, piece = i - r * pieces;
          dst[u] = r * geo.ld + piece * 8;
          if (piece < real_pieces) {
            const int p = off + p0 + r;
            const int64_t row = a.by_token ? a.permuted_route[p] / a.slots : p;
            v[u] = __ldg(
                reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + row * a.ldx) +
                piece);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (dst[u] < 0) continue;
        if (check &&
            (nonfinite(v[u].x) || nonfinite(v[u].y) || nonfinite(v[u].z) || nonfinite(v[u].w))) {
          const int r = (i0 + u * kWarps * 32) / pieces;
          atomicOr(a.error, 4);
          atomicMin(a.error + 1, a.permuted_route[off + p0 + r] / a.slots);
        }
        *reinterpret_cast<uint4*>(xs + dst[u]) = v[u];
      }
    }
    __syncthreads();

    // 4. The K loop: per step, 4 A registers from the codes, one mma per 8 routes.
    const int nch = (rows + 7) / 8;
    float acc[kMC][4], blk[kMC][4];
#pragma unroll
    for (int ch = 0; ch < kMC; ++ch) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[ch][i] = blk[ch][i] = 0.0f;
    }
    float s0 = 0.0f, s1 = 0.0f, z0 = mid, z1 = mid;
    uint32_t sub0 = 0, sub1 = 0;
    auto flush = [&]() {
#pragma unroll
      for (int ch = 0; ch < kMC; ++ch) {
        acc[ch][0] = fmaf(s0, blk[ch][0], acc[ch][0]);
        acc[ch][1] = fmaf(s0, blk[ch][1], acc[ch][1]);
        acc[ch][2] = fmaf(s1, blk[ch][2], acc[ch][2]);
        acc[ch][3] = fmaf(s1, blk[ch][3], acc[ch][3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) blk[ch][i] = 0.0f;
      }
    };
    auto load_scale = [&](int kp) {  // the block holding K position kp
      const int b = kp >> geo.shift;
      s0 = sc[g * nbp + b];
      s1 = sc[(g + 8) * nbp + b];
      if (has_zp) {
        z0 = zs[g * nbp + b];
        z1 = zs[(g + 8) * nbp + b];
      }
      sub0 = pair_of<kBf16>(base + z0);
      sub1 = pair_of<kBf16>(base + z1);
    };
    const uint16_t* xr[kMC];
#pragma unroll
    for (int ch = 0; ch < kMC; ++ch) {
      xr[ch] = (8 * ch + g < rows ? xs + (8 * ch + g) * geo.ld : zrow) + 4 * t;
    }
    int bound = kChunkK * c0;  // kSpb < 0: where the current block ends
    if (kSpb == 0) load_scale(kChunkK * c0);
    auto process = [&](const uint4& wv, int kc) {
      const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const int kp = kc + 16 * st;
        if constexpr (kSpb > 0) {
          if (st % kSpb == 0) {
            flush();
            load_scale(kp);
          }
        } else if constexpr (kSpb < 0) {
          if (kp >= bound) {  // warp-uniform
            flush();
            load_scale(kp);
            bound = (kp & ~bs_mask) + bs_mask + 1;
          }
        }
        uint32_t af[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int pair = 4 * st + j;
          const uint32_t v = w[pair / kPairsPerWord] >> (kBits * (pair % kPairsPerWord));
          af[j] = codes_to_pair<kBits, kBf16>(v, (j & 1) ? sub1 : sub0, (j & 1) ? z1 : z0);
        }
#pragma unroll
        for (int ch = 0; ch < kMC; ++ch) {
          if (kMC == 1 || ch < nch) {
            const uint2 bv = *reinterpret_cast<const uint2*>(xr[ch] + kp);
            mma16816<kBf16>(blk[ch], af, bv.x, bv.y);
          }
        }
      }
    };
    // The chunk kRing ahead: a running pointer, so the loop does not recompute the expert's and
    // tile's offsets per chunk. A ring slot is refilled after its chunk is decoded (no copy).
    const uint32_t* wnext = wbase + (c0 + kRing) * 128;
    for (int c = c0; c < c1; c += kRing) {
#pragma unroll
      for (int i = 0; i < kRing; ++i) {
        if (c + i < c1) {
          const int kc = kChunkK * (c + i);
          if constexpr (kSpb == 0) {
            if (c + i > c0 && (kc & bs_mask) == 0) {  // a block starts with this chunk
              flush();
              load_scale(kc);
            }
          }
          process(ring[i], kc);
          if (c + i + kRing < c1) ring[i] = load_stream(wnext);
          wnext += 128;
        }
      }
    }
    flush();

    // 5. The warps' partial sums, added in warp order by warp 0, then the epilogue.
    if (warp > 0) {
#pragma unroll
      for (int ch = 0; ch < kMC; ++ch) {
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp - 1][ch][i][lane] = acc[ch][i];
      }
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int ch = 0; ch < kMC; ++ch) {
        if (ch >= nch) continue;
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float sum = acc[ch][i];
#pragma unroll
          for (int w = 0; w < kWarps - 1; ++w) sum = sum + red[w][ch][i][lane];
          v[i] = sum;
        }
        epilogue(a, e, m, g, lr0, lr1, off + p0, rows, 8 * ch + 2 * t, v, kBf16);
      }
    }
  }
}

template <int kBits, bool kBf16, int kMC, int kSpb>
Status launch_one(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                  cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.shape.tiles), static_cast<unsigned>(a.max_groups));
  QMOE_CUDA_TRY(launch_maybe_pdl(&decode_fc_kernel<kBits, kBf16, kMC, kSpb>, grid,
                                 dim3(kWarps * 32), smem, stream, a.pdl, a, geo));
  QMOE_CUDA_CHECK_LAUNCH("decode_fc_kernel");
  return Status::ok();
}

// The scale-block variants a width has: 16-byte chunks of int2 hold 8 K steps (blocks of 1, 2 or
// 4 steps inside one), int4 4 steps (1 or 2), int8 2 steps (1); int3 chunks of 5 steps never
// align with power-of-two blocks.
template <int kBits>
constexpr bool has_spb(int spb) {
  if (kBits == 3) return spb == -1;
  return spb == 0 || (spb > 0 && spb < 16 / kBits);
}

template <int kBits, bool kBf16, int kMC>
Status launch_spb(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                  cudaStream_t stream) {
  if constexpr (kBits == 3) {
    return launch_one<kBits, kBf16, kMC, -1>(a, geo, smem, stream);
  } else {
    switch (geo.spb) {
      case 0:
        return launch_one<kBits, kBf16, kMC, 0>(a, geo, smem, stream);
      case 1:
        return launch_one<kBits, kBf16, kMC, 1>(a, geo, smem, stream);
      case 2:
        if constexpr (has_spb<kBits>(2))
          return launch_one<kBits, kBf16, kMC, 2>(a, geo, smem, stream);
        break;
      case 4:
        if constexpr (has_spb<kBits>(4))
          return launch_one<kBits, kBf16, kMC, 4>(a, geo, smem, stream);
        break;
      default:
        break;
    }
    return Status::internal("decode: no kernel for " + std::to_string(geo.spb) +
                            " steps per scale block at " + std::to_string(kBits) + " bits");
  }
}

template <int kBits>
Status launch_decode_bits(const DecodeFcArgs& a, const DecodeGeometry& geo, size_t smem,
                          int route_groups, cudaStream_t stream) {
  const bool bf16 = a.dtype == DType::kBF16;
  if (route_groups == 1) {
    return bf16 ? launch_spb<kBits, true, 1>(a, geo, smem, stream)
                : launch_spb<kBits, false, 1>(a, geo, smem, stream);
  }
  return bf16 ? launch_spb<kBits, true, 2>(a, geo, smem, stream)
              : launch_spb<kBits, false, 2>(a, geo, smem, stream);
}

template <int kBits, bool kBf16, int kMC, int kSpb>
Status opt_in() {
  if constexpr (has_spb<kBits>(kSpb)) {
    QMOE_CUDA_TRY(cudaFuncSetAttribute(&decode_fc_kernel<kBits, kBf16, kMC, kSpb>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kMaxDynamicSmem));
  }
  return Status::ok();
}

template <int kBits, bool kBf16, int kMC>
Status opt_in_all_spb() {
  QMOE_RETURN_IF_ERROR((opt_in<kBits, kBf16, kMC, -1>()));
  QMOE_RETURN_IF_ERROR((opt_in<kBits, kBf16, kMC, 0>()));
  QMOE_RETURN_IF_ERROR((opt_in<kBits, kBf16, kMC, 1>()));
  QMOE_RETURN_IF_ERROR((opt_in<kBits, kBf16, kMC, 2>()));
  return opt_in<kBits, kBf16, kMC, 4>();
}

template <int kBits>
Status prepare_decode_bits() {
  QMOE_RETURN_IF_ERROR((opt_in_all_spb<kBits, true, 1>()));
  QMOE_RETURN_IF_ERROR((opt_in_all_spb<kBits, true, 2>()));
  QMOE_RETURN_IF_ERROR((opt_in_all_spb<kBits, false, 1>()));
  return opt_in_all_spb<kBits, false, 2>();
}

}  // namespace qmoe::cuda::decode_detail

// The grouped GEMM for f32 operands, on CUDA cores: the accurate path (no TF32). Every product is
// accumulated with one fmaf, i.e. one rounding per term, in ascending k.
//
// A block computes a 128 x 64 tile of C with 256 threads, each an 8 x 4 register micro-tile (rows
// ty*4 + {0..3} and 64 + ty*4 + {0..3}, columns tx*4 + {0..3}). K advances 16 at a time; operands
// are staged through registers into double-buffered shared memory, transposed to k-major so that a
// micro-tile's operands are two float4 (A) and one float4 (B) per k.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/gemm/gemm_launchers.cuh"
#include "cuda/gemm/gemm_schedule.cuh"

namespace qmoe::cuda::gemm_detail {
namespace {

constexpr int kBM = kGemmTileM;  // 128
constexpr int kBN = 64;
constexpr int kBK = 16;  // divides kGemmKAlign
constexpr int kThreads = 256;
// Row padding of the k-major tiles: keeps float4 alignment and spreads the transposed stores.
constexpr int kPad = 4;
static_assert(kGemmKAlign % kBK == 0, "K tiles must not straddle the caller's K padding");

__global__ void __launch_bounds__(kThreads) f32_gemm_kernel(const GroupedGemmArgs p) {
  __shared__ __align__(16) float a_s[2][kBK][kBM + kPad];
  __shared__ __align__(16) float b_s[2][kBK][kBN + kPad];
  const int tid = threadIdx.x;
  const int tx = tid & 15;  // column group
  const int ty = tid >> 4;  // row group
  const int n = static_cast<int>(p.n);
  const int n0 = blockIdx.x * kBN;
  const int k_tiles = static_cast<int>(p.k / kBK);

  // Loader: thread tid reads k quad (tid & 3) of A rows (tid >> 2) and (tid >> 2) + 64 and of B
  // row (tid >> 2).
  const int ld_row = tid >> 2;
  const int ld_k = (tid & 3) * 4;

  for (int64_t y = blockIdx.y; y < p.max_tiles; y += gridDim.y) {
    TileRows w;
    if (!find_tile(p, y, &w)) return;  // tiles only grow with y: the rest are past the wave too
    if (w.rows <= 0) continue;         // an inconsistent schedule: nothing of this tile exists

    const float* a_base = static_cast<const float*>(p.a);
    const float* b_base =
        static_cast<const float*>(p.b) + static_cast<int64_t>(w.group - p.first_group) * p.b_stride;
    // Out-of-range rows are never read: they load zeros.
    const bool a_ok0 = ld_row < w.rows, a_ok1 = ld_row + 64 < w.rows;
    const bool b_ok = n0 + ld_row < n;
    const float* a_src0 = a_base + (w.row0 + (a_ok0 ? ld_row : 0)) * p.lda + ld_k;
    const float* a_src1 = a_base + (w.row0 + (a_ok1 ? ld_row + 64 : 0)) * p.lda + ld_k;
    const float* b_src = b_base + static_cast<int64_t>(b_ok ? n0 + ld_row : n0) * p.ldb + ld_k;

    float4 ra0, ra1, rb;
    auto fetch = [&](int kt) {
      const int64_t k0 = static_cast<int64_t>(kt) * kBK;
      const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      ra0 = a_ok0 ? __ldg(reinterpret_cast<const float4*>(a_src0 + k0)) : zero;
      ra1 = a_ok1 ? __ldg(reinterpret_cast<const float4*>(a_src1 + k0)) : zero;
      rb = b_ok ? __ldg(reinterpret_cast<const float4*>(b_src + k0)) : zero;
    };
    auto stash = [&](int buf) {
      const float va0[4] = {ra0.x, ra0.y, ra0.z, ra0.w};
      const float va1[4] = {ra1.x, ra1.y, ra1.z, ra1.w};
      const float vb[4] = {rb.x, rb.y, rb.z, rb.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        a_s[buf][ld_k + j][ld_row] = va0[j];
        a_s[buf][ld_k + j][ld_row + 64] = va1[j];
        b_s[buf][ld_k + j][ld_row] = vb[j];
      }
    };

    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    fetch(0);
    stash(0);
    __syncthreads();
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int buf = kt & 1;
      if (kt + 1 < k_tiles) fetch(kt + 1);  // in flight while this tile is multiplied
#pragma unroll
      for (int kk = 0; kk < kBK; ++kk) {
        const float4 a_lo = *reinterpret_cast<const float4*>(&a_s[buf][kk][ty * 4]);
        const float4 a_hi = *reinterpret_cast<const float4*>(&a_s[buf][kk][64 + ty * 4]);
        const float4 bv = *reinterpret_cast<const float4*>(&b_s[buf][kk][tx * 4]);
        const float av[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
        const float bw[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bw[j], acc[i][j]);
      }
      // The other buffer was last read in iteration kt - 1, which every thread finished before
      // the barrier that ended it.
      if (kt + 1 < k_tiles) stash(buf ^ 1);
      __syncthreads();
    }

    const bool quads = (p.ldc & 3) == 0;  // float4 stores need 16-byte aligned rows
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = (i < 4 ? 0 : 64) + ty * 4 + (i & 3);
      if (row >= w.rows) continue;
      float* c_row = p.c + (w.row0 + row) * p.ldc;
      const int col = n0 + tx * 4;
      if (quads && col + 3 < n) {
        *reinterpret_cast<float4*>(c_row + col) =
            make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (col + j < n) c_row[col + j] = acc[i][j];
        }
      }
    }
  }
}

}  // namespace

Status launch_f32_gemm(const GroupedGemmArgs& args, cudaStream_t stream) {
  const int64_t grid_y = args.max_tiles < kMaxGridY ? args.max_tiles : kMaxGridY;
  const dim3 grid(static_cast<unsigned>((args.n + kBN - 1) / kBN), static_cast<unsigned>(grid_y));
  f32_gemm_kernel<<<grid, kThreads, 0, stream>>>(args);
  QMOE_CUDA_CHECK_LAUNCH("f32_gemm_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda::gemm_detail

// The grouped GEMM for bf16 / f16 operands: mma.sync m16n8k16 with fp32 accumulation.
//
// A block computes a 128 x 128 tile of C (one M tile of one group, one N tile) with 4 warps in a
// 2 (M) x 2 (N) layout, 64 x 64 per warp; two blocks share an SM. K advances 64 at a time through
// a 3-stage cp.async pipeline (one __syncthreads per K tile); operands reach the tensor cores
// through ldmatrix. Measured on an H200 (bf16, one 8192 x 4096 x 4096 group): about 420 TFLOP/s,
// against about 345 for 8 warps of 64 x 32 (more ldmatrix per mma), 320 for 128 x 256 tiles (one
// block per SM) and 375 for 32-wide K tiles in 4 stages (twice the barriers).
//
// Shared memory per stage: A and B tiles of 128 rows x 64 halves (128 bytes a row, eight 16-byte
// chunks), 32 KiB; 96 KiB a block. ldmatrix reads 8 rows at one chunk column: unswizzled, all 8 hit
// the same banks. Chunk c of row r is stored at chunk c ^ (r & 7), so the 8 rows cover the 8
// 16-byte slots of a bank line exactly once; cp.async writes stay whole 128-byte rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/gemm/gemm_launchers.cuh"
#include "cuda/gemm/gemm_schedule.cuh"

namespace qmoe::cuda::gemm_detail {
namespace {

constexpr int kBM = kGemmTileM;  // 128
constexpr int kBN = 128;
constexpr int kBK = 64;
constexpr int kStages = 3;
constexpr int kWarpsN = 2;
constexpr int kMinBlocks = 2;
constexpr int kPanel = 8;   // M tiles a raster panel spans
constexpr int kWarpM = 64;  // rows per warp: 2 warps along M
constexpr int kWarpN = kBN / kWarpsN;
constexpr int kThreads = 64 * kWarpsN;
constexpr int kMI = kWarpM / 16;  // m16 tiles per warp
constexpr int kNI = kWarpN / 8;   // n8 tiles per warp
constexpr int kKSteps = kBK / 16;
constexpr int kChunks = kBK / 8;  // 16-byte chunks per tile row
constexpr int kRowBytes = kBK * 2;
constexpr int kABytes = kBM * kRowBytes;
constexpr int kStageBytes = (kBM + kBN) * kRowBytes;  // A then B
constexpr int kSmemBytes = kStages * kStageBytes;
constexpr int kRowsPerPass = kThreads / kChunks;
constexpr int kAPasses = kBM / kRowsPerPass;
constexpr int kBPasses = kBN / kRowsPerPass;
static_assert(kBK == 32 || kBK == 64, "the swizzle handles 64- and 128-byte rows");
static_assert(kBK % kGemmKAlign == 0 || kGemmKAlign % kBK == 0, "K tiles vs the K alignment");
static_assert(kNI % 2 == 0 && kRowsPerPass % 8 == 0 && kBM % kRowsPerPass == 0 &&
                  kBN % kRowsPerPass == 0,
              "tile shape");

// Byte offset of 16-byte chunk `chunk` of tile row `row` inside one operand tile. ldmatrix reads
// 8 consecutive rows at one chunk column; the XOR spreads them over the 8 16-byte slots of a
// 128-byte bank line (64-byte rows: 2 rows a line, so the row pair index selects the slot).
__device__ __forceinline__ uint32_t swizzle(int row, int chunk) {
  const int x = kChunks == 8 ? (row & 7) : ((row >> 1) & 3);
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ x) << 4));
}

// 16-byte global->shared copy; src_bytes == 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// grid: x = kPanel M tiles x N tiles, y = panels of kPanel M tiles (capped at kMaxGridY; blocks
// then stride). Blocks are started x fastest: a panel's kPanel M tiles of one N tile, then the
// next N tile. The blocks resident together thus span a few A tiles and a few N tiles of the B of
// their groups, a working set L2 holds even for wide N.
template <bool kBf16>
__global__ void __launch_bounds__(kThreads, kMinBlocks) mma_gemm_kernel(const GroupedGemmArgs p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int warp_m = warp / kWarpsN;
  const int warp_n = warp % kWarpsN;
  const int n = static_cast<int>(p.n);
  const int n0 = static_cast<int>(blockIdx.x / kPanel) * kBN;
  const int panel_row = static_cast<int>(blockIdx.x % kPanel);
  const int k = static_cast<int>(p.k);
  const int k_tiles = (k + kBK - 1) / kBK;

  // Loader: thread tid copies chunk tid % kChunks of tile rows tid / kChunks + i * kRowsPerPass
  // of A and of B, so a warp writes whole rows (512 contiguous bytes of shared memory) per copy.
  // Rows kRowsPerPass apart (a multiple of 8) share the swizzle.
  const int ld_row = tid / kChunks;
  const int ld_chunk = tid % kChunks;
  const uint32_t ld_dst = swizzle(ld_row, ld_chunk);

  // ldmatrix addresses (stage- and K-step-free parts). A x4: lanes 0-15 give rows 0-15 at k 0-7,
  // lanes 16-31 the same rows at k 8-15: registers a0..a3 in mma's fragment order. B x4: lanes
  // 0-7 rows (n) 0-7 at k 0-7, 8-15 rows 0-7 at k 8-15, 16-23 rows 8-15 at k 0-7, 24-31 rows 8-15
  // at k 8-15: {b0, b1} of two n8 tiles. Adding multiples of 8 rows leaves the swizzle unchanged,
  // so it is per lane: tiles 16 rows apart are 16 * kRowBytes bytes apart.
  const int a_row = warp_m * kWarpM + (lane & 15);
  const int a_half = lane >> 4;
  const int b_row = warp_n * kWarpN + (lane & 7) + ((lane >> 4) << 3);
  const int b_half = (lane >> 3) & 1;
  uint32_t a_frag_off[kKSteps], b_frag_off[kKSteps];  // by 16-wide K step within the K tile
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    a_frag_off[ks] = swizzle(a_row, ks * 2 + a_half);
    b_frag_off[ks] = kABytes + swizzle(b_row, ks * 2 + b_half);
  }

  for (int64_t panel = blockIdx.y;; panel += gridDim.y) {
    const int64_t y = panel * kPanel + panel_row;
    TileRows w;
    if (y >= p.max_tiles || !find_tile(p, y, &w)) return;  // later y are past the wave too
    if (w.rows <= 0) continue;  // an inconsistent schedule: nothing of this tile exists

    using Elem = uint16_t;
    // Each thread's first row of A and B; rows out of range copy zero bytes from that valid
    // address instead (rows 0 of the tile always exist).
    const Elem* a_first = static_cast<const Elem*>(p.a) + w.row0 * p.lda + ld_chunk * 8;
    const Elem* b_first = static_cast<const Elem*>(p.b) +
                          static_cast<int64_t>(w.group - p.first_group) * p.b_stride +
                          static_cast<int64_t>(n0) * p.ldb + ld_chunk * 8;
    const Elem* a_src[kAPasses];
    const Elem* b_src[kBPasses];
    int a_bytes[kAPasses], b_bytes[kBPasses];
#pragma unroll
    for (int i = 0; i < kAPasses; ++i) {
      const int r = ld_row + i * kRowsPerPass;
      a_bytes[i] = r < w.rows ? 16 : 0;
      a_src[i] = a_first + (r < w.rows ? r * p.lda : 0);
    }
#pragma unroll
    for (int i = 0; i < kBPasses; ++i) {
      const int r = ld_row + i * kRowsPerPass;
      b_bytes[i] = n0 + r < n ? 16 : 0;
      b_src[i] = b_first + (n0 + r < n ? r * p.ldb : 0);
    }

    auto load_stage = [&](int stage, int kt) {
      const uint32_t s = smem_base + stage * kStageBytes + ld_dst;
      const int k0 = kt * kBK;
      // K is a multiple of 32 only: past it (the second half of a last 64-wide tile) load zeros.
      const bool k_ok = kBK == kGemmKAlign || k0 + ld_chunk * 8 < k;
#pragma unroll
      for (int i = 0; i < kAPasses; ++i) {
        cp_async_16(s + i * kRowsPerPass * kRowBytes, a_src[i] + (k_ok ? k0 : 0),
                    k_ok ? a_bytes[i] : 0);
      }
#pragma unroll
      for (int i = 0; i < kBPasses; ++i) {
        cp_async_16(s + kABytes + i * kRowsPerPass * kRowBytes, b_src[i] + (k_ok ? k0 : 0),
                    k_ok ? b_bytes[i] : 0);
      }
    };

    float acc[kMI][kNI][4];
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;
      }
    }

    // Prologue: stages 0..kStages-2 in flight. A group is committed even when empty so that
    // wait_group counts stay uniform.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) load_stage(s, s);
      cp_async_commit();
    }

    for (int kt = 0; kt < k_tiles; ++kt) {
      cp_async_wait<kStages - 2>();  // tile kt has landed (for this thread)
      __syncthreads();               // ... for every thread; and stage (kt - 1) is free again
      const int next = kt + kStages - 1;
      if (next < k_tiles) load_stage(next % kStages, next);
      cp_async_commit();

      const uint32_t s = smem_base + (kt % kStages) * kStageBytes;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t af[kMI][4], bf[kNI][2];
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi) {
          ldmatrix_x4(af[mi], s + a_frag_off[ks] + mi * 16 * kRowBytes);
        }
#pragma unroll
        for (int nj = 0; nj < kNI / 2; ++nj) {
          uint32_t r[4];
          ldmatrix_x4(r, s + b_frag_off[ks] + nj * 16 * kRowBytes);
          bf[2 * nj][0] = r[0];
          bf[2 * nj][1] = r[1];
          bf[2 * nj + 1][0] = r[2];
          bf[2 * nj + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
          for (int ni = 0; ni < kNI; ++ni) {
            mma_16816<kBf16>(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
          }
      }
    }
    cp_async_wait<0>();  // only empty groups remain; drained so the next tile starts clean
    __syncthreads();     // every warp is done with shared memory before the next tile's prologue

    // Epilogue: c0,c1 of an m16n8 tile are row lane/4, columns 2*(lane%4)+{0,1}; c2,c3 the row 8
    // below. A quad writes 32 contiguous bytes of a row: whole sectors.
    const bool pairs = (p.ldc & 1) == 0;  // float2 stores need 8-byte aligned rows
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp_m * kWarpM + mi * 16 + (lane >> 2) + half * 8;
        if (row >= w.rows) continue;
        float* c_row = p.c + (w.row0 + row) * p.ldc;
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) {
          const int col = n0 + warp_n * kWarpN + ni * 8 + (lane & 3) * 2;
          const float v0 = acc[mi][ni][half * 2], v1 = acc[mi][ni][half * 2 + 1];
          if (pairs && col + 1 < n) {
            *reinterpret_cast<float2*>(c_row + col) = make_float2(v0, v1);
          } else {
            if (col < n) c_row[col] = v0;
            if (col + 1 < n) c_row[col + 1] = v1;
          }
        }
      }
    }
  }
}

template <bool kBf16>
Status launch_typed(const GroupedGemmArgs& args, cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  QMOE_RETURN_IF_ERROR(configure_once(&configured, [] {
    QMOE_CUDA_TRY(cudaFuncSetAttribute(mma_gemm_kernel<kBf16>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    // Ask for the largest shared-memory carveout so that two 64 KiB blocks fit one SM.
    QMOE_CUDA_TRY(cudaFuncSetAttribute(mma_gemm_kernel<kBf16>,
                                       cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
    return Status::ok();
  }));
  const int64_t panels = (args.max_tiles + kPanel - 1) / kPanel;
  const int64_t grid_y = panels < kMaxGridY ? panels : kMaxGridY;
  const dim3 grid(static_cast<unsigned>((args.n + kBN - 1) / kBN * kPanel),
                  static_cast<unsigned>(grid_y));
  mma_gemm_kernel<kBf16><<<grid, kThreads, kSmemBytes, stream>>>(args);
  QMOE_CUDA_CHECK_LAUNCH("mma_gemm_kernel");
  return Status::ok();
}

}  // namespace

Status launch_mma_gemm(const GroupedGemmArgs& args, cudaStream_t stream) {
  return args.dtype == DType::kBF16 ? launch_typed<true>(args, stream)
                                    : launch_typed<false>(args, stream);
}

}  // namespace qmoe::cuda::gemm_detail

// The FP8 grouped GEMM's mainloop with its promotions overlapped (cutlass_fp8.cu's instances).
//
// CUTLASS's SM90 blockwise-scaled ptr-array mainloop runs each 128-wide K tile as: issue the
// tile's four wgmma into a block accumulator, wait for all of them, then promote (accum += block
// * scale_a * scale_b, the scales of that K tile). The wait drains the tensor pipe and the
// promotion's FMULs and FADDs run while it is idle, once per K tile, in both consumer warpgroups
// at about the same time (bench/results/2026-12-04-h200-knobs-fp8-cluster.md: FC1 of DeepSeek-V3
// at 4096 tokens with DRAM and SMs at 40-48%).
//
// This mainloop keeps two block accumulators and alternates them by K tile, so the tile k + 1's
// wgmma are issued before tile k is promoted:
//
//   issue k into blk[k % 2] | wait until at most one batch is in flight (k - 1 done) |
//   scales of k - 1 from its stage, release the stage | promote blk[(k - 1) % 2] | issue k + 1 ...
//
// and the tensor pipe runs tile k while the CUDA cores promote tile k - 1. The loop is unrolled
// by two so that each accumulator is a fixed set of registers (an indexed pair would go to local
// memory). Everything else (the producer's loads, the shared-memory layouts, the scales' layouts,
// the stage releases' order, the last stage left to mma_tail) is the base collective's, which
// this class derives from; only mma() is its own.
//
// The promotion is one FFMA per sum: fp8_block accum = fma(block, scale_b * scale_a, accum),
// per-row weight scales accum = fma(block * scale_a, scale_b, accum). The base's is a multiply
// and an add (the library builds with -fmad=false): with 64 sums per thread per K tile, those were
// two of every three instructions a consumer warp issues per K tile (SASS: 96 FMUL and 64 FADD of
// 240, against the tile's 4 wgmma); the FFMA form issues 32 FMUL and 64 FFMA, and its single
// rounding only makes the sums more accurate.
//
// Registers: the accumulator and two block accumulators, 3 x 64 fp32 per thread for the
// 128 x 128 (cooperative) and 128 x 64 (pingpong) tiles, plus the tile's distinct scales.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace qmoe::cuda::cutlass_detail {

template <class Base>
struct Fp8OverlappedMainloop : Base {
  using typename Base::ElementBlockScale;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutSFA;
  using typename Base::SmemLayoutSFB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  static constexpr int ScaleMsPerTile = Base::ScaleMsPerTile;
  static constexpr int ScaleNsPerTile = Base::ScaleNsPerTile;
  // One promotion per K tile: the K tile is one scale block (cutlass_fp8.cu's configuration).
  static_assert(Base::ScaleGranularityK == cute::size<2>(TileShape{}),
                "one scale block per K tile");
  static_assert(ScaleNsPerTile > 1, "activation scales per row (ScaleGranularityN 1)");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");

    // The operands and the scales in shared memory, partitioned as the base collective does:
    // the scales broadcast along the other mode (stride 0), so each thread's scale tensors have
    // its accumulators' shape and hold only the distinct values.
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(
            make_shape(shape<0>(SmemLayoutSFA{}), get<1>(TileShape{}),
                       make_shape(shape<1>(SmemLayoutSFA{}), shape<2>(SmemLayoutSFA{}))),
            make_stride(stride<0>(SmemLayoutSFA{}), _0{},
                        make_stride(stride<1>(SmemLayoutSFA{}), stride<2>(SmemLayoutSFA{})))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(
            make_shape(get<0>(TileShape{}), shape<0>(SmemLayoutSFB{}),
                       make_shape(shape<1>(SmemLayoutSFB{}), shape<2>(SmemLayoutSFB{}))),
            make_stride(_0{}, stride<0>(SmemLayoutSFB{}),
                        make_stride(stride<1>(SmemLayoutSFB{}), stride<2>(SmemLayoutSFB{})))));

    constexpr int kWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const Layout wg_layout =
        make_layout(Int<kWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int wg = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(wg_layout(wg));
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA,M,N,(K,PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    Tensor tCsA = thread_mma.partition_A(sA);  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCsB = thread_mma.partition_B(sB);
    Tensor tCrA = thread_mma.make_fragment_A(tCsA);  // descriptors
    Tensor tCrB = thread_mma.make_fragment_B(tCsB);
    Tensor tCrSFA = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor tCrSFB = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));

    Tensor blk0 = make_fragment_like(accum);
    Tensor blk1 = make_fragment_like(accum);
    clear(accum);
    warpgroup_fence_operand(accum);

    // Waits for a stage's operands and issues its K tile's wgmma into blk (zeroed by the first).
    auto issue = [&](auto& blk, PipelineState const& st) {
      pipeline.consumer_wait(st);
      const int stage = st.index();
      warpgroup_fence_operand(blk);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        cute::gemm(tiled_mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), blk);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(blk);
    };
    // Promotes a finished block accumulator with its stage's scales. The scales are read before
    // the stage is released (release: every stage but the call's last, which mma_tail releases).
    auto promote = [&](auto& blk, PipelineState const& st, bool release) {
      const int stage = st.index();
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), tCrSFA);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), tCrSFB);
      if (release) pipeline.consumer_release(st);
      warpgroup_fence_operand(blk);
      if constexpr (ScaleMsPerTile == 1) {  // fp8_block: one weight scale per tile and K tile
        const ElementBlockScale scale_a = tCrSFA(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(tCrSFB)); ++i) {
          filter_zeros(tCrSFB)(i) = filter_zeros(tCrSFB)(i) * scale_a;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) = __fmaf_rn(blk(i), tCrSFB(i), accum(i));
      } else {  // per-row weight scales
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) {
          accum(i) = __fmaf_rn(blk(i) * tCrSFA(i), tCrSFB(i), accum(i));
        }
      }
      warpgroup_fence_operand(accum);
    };

    if (k_tile_count <= 0) return;
    // Tiles 0, 1, 2, ... go to blk0, blk1, blk0, ...; s0 and s1 are the stages they read.
    PipelineState s0 = smem_pipe_read, s1;
    issue(blk0, s0);
    ++smem_pipe_read;
    int k = 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k + 1 < k_tile_count; k += 2) {
      s1 = smem_pipe_read;
      issue(blk1, s1);
      ++smem_pipe_read;
      warpgroup_wait<1>();  // tile k - 1 (blk0) done; tile k may run
      promote(blk0, s0, true);
      s0 = smem_pipe_read;
      issue(blk0, s0);
      ++smem_pipe_read;
      warpgroup_wait<1>();  // tile k (blk1) done
      promote(blk1, s1, true);
    }
    if (k < k_tile_count) {  // an even count: the last tile goes to blk1
      s1 = smem_pipe_read;
      issue(blk1, s1);
      warpgroup_wait<1>();
      promote(blk0, s0, true);
      warpgroup_wait<0>();
      promote(blk1, s1, false);
    } else {
      warpgroup_wait<0>();
      promote(blk0, s0, false);
    }
  }
};

}  // namespace qmoe::cuda::cutlass_detail

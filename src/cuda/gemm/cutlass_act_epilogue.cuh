// FC1's epilogue with the gated activation in it: the mixed-input GEMM's accumulators go through
// SwiGLU / GeGLU in registers and leave as FC2's input rows in the activation dtype, so FC1's
// fp32 rows are never written and the separate activation kernel never runs
// (MixedGemmArgs::act_epilogue). Included by the mixed-input instances only.
//
// The pairing. A wgmma m64nNk16 accumulator gives thread t of a warpgroup rows w 16 + t / 4 and
// w 16 + t / 4 + 8 of its 64 (w = warp), at columns 2 (t % 4) + {0, 1} + 8 j: rows r and r + 8 of
// every 16-row band meet in one thread. The prepared copy of FC1 orders its rows so that each
// band holds eight channels' gate rows, then the same channels' linear rows (glu_source_row in
// cutlass_mixed.h):
//
//   band b (prepared rows 16 b .. 16 b + 15)   rows 16 b + i      gate of channel 8 b + i
//                                              rows 16 b + 8 + i  linear of channel 8 b + i
//
// so each thread holds (gate, linear) pairs whole and no exchange is needed. Row m of a band's
// first half is channel (m / 16) 8 + m % 16. With the GEMM transposed (cutlass_mixed.h: M = the
// weight rows, N = the group's rows), the value at (m, n) goes to out[(row0 + n) * ld + channel]
// through the group's pointer (the setup kernel's ptr_d, already at row0).
//
// The activation is act_of_dots() (activation.cuh) with the route scale 1 and no biases, the
// same arithmetic the activation kernel does for such layers, on the same values (for bf16 the
// sums rounded to bf16 first, as the other tiles' FC1 rows are: mixed_out_dtype), so the two
// paths agree bit for bit. No shared memory, no TMA: CUTLASS's adapter for register-direct
// epilogues supplies the kernel's epilogue interface around operator().
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/numeric.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/activation.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/layout.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "qmoe/layer.h"

namespace qmoe::cuda::cutlass_detail {

template <typename Element>
class ActEpilogueOp {
  static constexpr bool kBf16 = std::is_same_v<Element, cutlass::bfloat16_t>;
  static_assert(kBf16 || std::is_same_v<Element, cutlass::half_t>, "bf16 or f16 rows");

 public:
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementOutput = Element;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = void;
  using ElementD = Element;
  using StrideC = cutlass::detail::TagToStrideC_t<cutlass::layout::ColumnMajor*>;
  using StrideD = StrideC;
  using InternalStrideC = cute::remove_pointer_t<StrideC>;
  using InternalStrideD = cute::remove_pointer_t<StrideD>;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  struct ThreadEpilogueOp {};  // CUTLASS's device adapter names one; nothing reads it

  struct SharedStorage {};
  using TensorMapStorage = SharedStorage;

  struct Arguments {
    void* const* ptr_out = nullptr;  // per group: its first output row
    int64_t ld_out = 0;              // elements between output rows
    ActivationSpec act{};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }

  CUTLASS_HOST_DEVICE explicit ActEpilogueOp(Params const& p) : params_(p) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_mnk,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& acc, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    const int m_extent = get<0>(problem_shape_mnkl);
    const int n_extent = get<1>(problem_shape_mnkl);
    const auto m_coord = get<0>(blk_coord_mnkl);
    const auto n_coord = get<1>(blk_coord_mnkl);
    const int group = static_cast<int>(get<3>(blk_coord_mnkl));
    // The accumulators' coordinates (m, n) in the group's product, partitioned as they are.
    Tensor cd = local_tile(make_identity_tensor(make_shape(m_extent, n_extent)),
                           take<0, 2>(blk_shape_mnk), make_coord(m_coord, n_coord));
    Tensor tcd = tiled_mma.get_thread_slice(thread_idx).partition_C(cd);
    static_assert(decltype(rank<0>(acc))::value == 3 && decltype(size<0, 0>(acc))::value == 2 &&
                      decltype(size<0, 1>(acc))::value == 2,
                  "a wgmma accumulator: values (column pair, row half, column block)");
    // The activation kernel's rounding (core/numeric.h), bit for bit.
    uint16_t* out = static_cast<uint16_t*>(params_.ptr_out[group]);
    const int64_t ld = params_.ld_out;
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < size<1>(acc); ++mm) {
      CUTLASS_PRAGMA_UNROLL
      for (int nn = 0; nn < size<2>(acc); ++nn) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<0, 2>(acc); ++j) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < 2; ++c) {
            const auto gate_at = make_coord(make_coord(c, 0, j), mm, nn);
            const auto lin_at = make_coord(make_coord(c, 1, j), mm, nn);
            const int m = get<0>(tcd(gate_at));
            const int n = get<1>(tcd(gate_at));
            if (m < m_extent && n < n_extent) {
              const int64_t channel = glu_band_channel(m);
              // The gate and linear sums as the other tiles' bf16 rows hold them
              // (mixed_out_dtype), so every tile's activation sees the same values.
              const float g =
                  kBf16 ? num::bf16_to_f32(num::f32_to_bf16(acc(gate_at))) : acc(gate_at);
              const float l =
                  kBf16 ? num::bf16_to_f32(num::f32_to_bf16(acc(lin_at))) : acc(lin_at);
              const float v = act_of_dots(params_.act, 1.0f, g, l, 0.0f, 0.0f);
              out[n * ld + channel] = kBf16 ? num::f32_to_bf16(v) : num::f32_to_f16(v);
            }
          }
        }
      }
    }
  }

 private:
  Params params_;
};

template <typename Element>
using ActEpilogue =
    cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<ActEpilogueOp<Element>>;

}  // namespace qmoe::cuda::cutlass_detail

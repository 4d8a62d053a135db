// The FP8 grouped GEMM of cutlass_fp8.h on CUTLASS's SM90 blockwise-scaled ptr-array kernel. The
// only translation unit that instantiates it.
//
// Configuration (the reasons; measured numbers belong in bench/results):
//   kernels  KernelPtrArrayTmaWarpSpecialized{Cooperative,Pingpong}FP8Blockwise: the grouped
//            GEMMs' schedules with the K-block scales applied at each promotion.
//   tiles    128 x 128 x 128 (cooperative) and 128 x 64 x 128 (pingpong, for few rows per
//            expert): K = 128 e4m3 codes are one 128-byte swizzle row and exactly one scale
//            block, so each K tile promotes once with one scale pair; M = 128 weight rows is the
//            weights' scale block (the collective needs the block to divide the tile).
//   scales   SFA (weights) in 128 x 128 blocks (fp8_block's own layout) or per weight row and
//            128 columns (row_scales: MXFP4's e4m3 copy), SFB (activations) per row and 128
//            columns (act_quant.h's rows), all K-major, none transposed.
//   D        bf16: FC1's rows feed the activation's FP8 quantization and FC2's the weighted
//            combine; fp32 rows would double both kernels' reads and the epilogue's writes
//            (0.94 GB of FC2 rows on DeepSeek-V3 at 4096 tokens) for precision the e4m3
//            rounding on either side discards.
//   cluster  2 x 1 x 1: two CTAs on neighbouring 128-row weight tiles of one expert share its
//            activation tile, which TMA multicasts to both (half the activation traffic from
//            L2). A group with an odd count of weight tiles gets one empty tile (the scheduler
//            rounds each group up to the cluster), none of the models' shapes has one. Measured
//            against 1 x 1 x 1 on DeepSeek-V3 with FP8 activations (bench/results/
//            2026-12-04-h200-knobs-fp8-cluster.md): 1-3% faster at 128-4096 tokens.
//
// Workspace of one launch (G = max_groups; each part 256-byte aligned):
//   shapes G x (n, rows, k); ptr_a, ptr_b, ptr_d, ptr_sfa, ptr_sfb G x pointer;
//   stride_a, stride_b, stride_d G x 8 bytes; cutlass Gemm::get_workspace_size.
#include "cuda/gemm/cutlass_fp8.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/gemm/cutlass_fp8_mainloop.cuh"
#include "cuda/gemm/cutlass_grouped_kernel.cuh"
#include "cutlass/detail/blockwise_scale_layout.hpp"

namespace qmoe::cuda {
namespace cutlass_detail {
namespace {

// Each schedule with its tile and epilogue (named outside templates: cutlass_grouped_kernel.cuh
// says why).
using Fp8CoopTile = cute::Shape<cute::_128, cute::_128, cute::_128>;
using Fp8PingTile = cute::Shape<cute::_128, cute::_64, cute::_128>;
using Fp8Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
// D in bf16 (the configuration above says why).
using Fp8CoopEpilogue = GroupEpilogueFor<Fp8CoopTile, Fp8Cluster, cutlass::bfloat16_t>;
constexpr int kFp8CoopEpilogueSmem = static_cast<int>(sizeof(Fp8CoopEpilogue::SharedStorage));
using Fp8PingEpilogue = GroupEpilogueFor<Fp8PingTile, Fp8Cluster, cutlass::bfloat16_t,
                                         cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
constexpr int kFp8PingEpilogueSmem = static_cast<int>(sizeof(Fp8PingEpilogue::SharedStorage));

// kScaleRowsA: the weights' scale block along their rows, 128 (fp8_block) or 1 (row_scales).
template <typename Tile, typename Epilogue, int kEpilogueSmem, typename Schedule, int kScaleRowsA>
struct Fp8GemmT {
  using Element = cutlass::float_e4m3_t;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using LayoutA = cutlass::layout::RowMajor;     // codes [n, k]: K-contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // the group's rows [rows, lda]: K-contiguous
  using ScaleConfig =
      cutlass::detail::Sm90BlockwiseScaleConfig<kScaleRowsA, 1, kFp8ScaleBlock,
                                                cute::GMMA::Major::K, cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  static constexpr int kAlign = 16;  // TMA: 16-byte rows of e4m3
  using Mainloop = Fp8OverlappedMainloop<typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element,
      cute::tuple<LayoutA*, LayoutSFA*>, kAlign, Element, cute::tuple<LayoutB*, LayoutSFB*>,
      kAlign, float, Tile, Fp8Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmem>, Schedule>::CollectiveOp>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  static_assert(sizeof(StrideA) == 8 && sizeof(StrideB) == 8 && sizeof(StrideD) == 8,
                "one 64-bit leading dimension per stride");
  static_assert(sizeof(Shape3) == 12, "(M, N, K) as three ints");
  static_assert(Mainloop::ScaleGranularityM == kScaleRowsA &&
                    Mainloop::ScaleGranularityN == 1 &&
                    Mainloop::ScaleGranularityK == kFp8ScaleBlock,
                "weights in 128 x 128 blocks or per row, activations per row, 128 columns");
};
using CoopSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
using PingSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise;
using Fp8Coop =
    Fp8GemmT<Fp8CoopTile, Fp8CoopEpilogue, kFp8CoopEpilogueSmem, CoopSchedule, kFp8ScaleBlock>;
using Fp8Ping =
    Fp8GemmT<Fp8PingTile, Fp8PingEpilogue, kFp8PingEpilogueSmem, PingSchedule, kFp8ScaleBlock>;
using Fp8CoopRows = Fp8GemmT<Fp8CoopTile, Fp8CoopEpilogue, kFp8CoopEpilogueSmem, CoopSchedule, 1>;
using Fp8PingRows = Fp8GemmT<Fp8PingTile, Fp8PingEpilogue, kFp8PingEpilogueSmem, PingSchedule, 1>;
// All four share the setup kernel's types.
using Fp8Gemm = Fp8Coop;
template <typename G>
constexpr bool kSameStrides = std::is_same_v<Fp8Gemm::StrideA, typename G::StrideA> &&
                              std::is_same_v<Fp8Gemm::StrideB, typename G::StrideB> &&
                              std::is_same_v<Fp8Gemm::StrideD, typename G::StrideD>;
static_assert(kSameStrides<Fp8Ping> && kSameStrides<Fp8CoopRows> && kSameStrides<Fp8PingRows>,
              "one setup kernel for every schedule and scale layout");

struct Fp8Parts {
  size_t shapes, ptr_a, ptr_b, ptr_d, ptr_sfa, ptr_sfb, stride_a, stride_b, stride_d, cutlass,
      total;
};

// One thread per group slot j (touched index j); slots past n_touched get no rows and valid
// pointers (expert 0's).
__global__ void fp8_setup_kernel(const Fp8GemmArgs p, Fp8Gemm::Shape3* shapes, const void** ptr_a,
                                 const void** ptr_b, uint16_t** ptr_d, const float** ptr_sfa,
                                 const float** ptr_sfb, Fp8Gemm::StrideA* stride_a,
                                 Fp8Gemm::StrideB* stride_b, Fp8Gemm::StrideD* stride_d) {
  const int n_touched = *p.sched.n_touched;
  const int64_t kb = p.k / kFp8ScaleBlock;
  const int64_t nb = fp8_weight_scale_rows(p.n, p.row_scales);
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < p.max_groups;
       j += gridDim.x * blockDim.x) {
    int rows = 0;
    int64_t row0 = 0, e = 0;
    if (j < n_touched) {
      e = p.sched.touched[j];
      row0 = p.sched.offsets[e];
      rows = p.sched.offsets[e + 1] - p.sched.offsets[e];
    }
    shapes[j] = Fp8Gemm::Shape3(static_cast<int>(p.n), rows, static_cast<int>(p.k));
    ptr_a[j] = p.codes + e * p.n * p.k;
    ptr_b[j] = p.a + row0 * p.lda;
    ptr_d[j] = p.c + row0 * p.ldc;
    ptr_sfa[j] = p.w_scales + e * nb * kb;
    ptr_sfb[j] = p.a_scales + row0 * kb;
    Fp8Gemm::StrideA sa{};
    cute::get<0>(sa) = p.k;
    stride_a[j] = sa;
    Fp8Gemm::StrideB sb{};
    cute::get<0>(sb) = p.lda;
    stride_b[j] = sb;
    Fp8Gemm::StrideD sd{};
    cute::get<1>(sd) = p.ldc;
    stride_d[j] = sd;
  }
}

template <typename G>
typename G::Gemm::Arguments fp8_arguments(int64_t max_groups, int sm_count, const Fp8Parts* parts,
                                          char* ws) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  auto at = [ws, parts](size_t Fp8Parts::*part) {
    return ws == nullptr || parts == nullptr ? nullptr : ws + parts->*part;
  };
  // Host problem shapes nullptr: the grid is one CTA per SM and nothing is read on the host.
  args.problem_shape = {static_cast<int>(max_groups),
                        reinterpret_cast<Fp8Gemm::Shape3*>(at(&Fp8Parts::shapes)), nullptr};
  auto& m = args.mainloop;
  m.ptr_A = reinterpret_cast<decltype(m.ptr_A)>(at(&Fp8Parts::ptr_a));
  m.dA = reinterpret_cast<decltype(m.dA)>(at(&Fp8Parts::stride_a));
  m.ptr_B = reinterpret_cast<decltype(m.ptr_B)>(at(&Fp8Parts::ptr_b));
  m.dB = reinterpret_cast<decltype(m.dB)>(at(&Fp8Parts::stride_b));
  m.ptr_SFA = reinterpret_cast<decltype(m.ptr_SFA)>(at(&Fp8Parts::ptr_sfa));
  m.ptr_SFB = reinterpret_cast<decltype(m.ptr_SFB)>(at(&Fp8Parts::ptr_sfb));
  // The per-group scale layouts are never read: the kernel derives each from the group's shape
  // (ScaleConfig::tile_atom_to_shape_SF*), which is why both scale arrays are packed per group.
  m.layout_SFA = nullptr;
  m.layout_SFB = nullptr;
  set_epilogue_and_grid(args, at(&Fp8Parts::ptr_d),
                        reinterpret_cast<Fp8Gemm::StrideD*>(at(&Fp8Parts::stride_d)), sm_count);
  return args;
}

template <typename G>
Fp8Parts fp8_parts(int64_t max_groups, int sm_count) {
  const size_t n = static_cast<size_t>(max_groups);
  Fp8Parts w{};
  WorkspaceCarver c;
  auto take = [&c](size_t bytes) { return c.take(bytes); };
  w.shapes = take(n * sizeof(Fp8Gemm::Shape3));
  w.ptr_a = take(n * sizeof(void*));
  w.ptr_b = take(n * sizeof(void*));
  w.ptr_d = take(n * sizeof(void*));
  w.ptr_sfa = take(n * sizeof(void*));
  w.ptr_sfb = take(n * sizeof(void*));
  w.stride_a = take(n * sizeof(Fp8Gemm::StrideA));
  w.stride_b = take(n * sizeof(Fp8Gemm::StrideB));
  w.stride_d = take(n * sizeof(Fp8Gemm::StrideD));
  w.cutlass = take(
      G::Gemm::get_workspace_size(fp8_arguments<G>(max_groups, sm_count, nullptr, nullptr)));
  w.total = c.off;
  return w;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename G>
Status launch_with(const Fp8GemmArgs& p, int sm_count, char* ws, cudaStream_t stream) {
  const Fp8Parts w = fp8_parts<G>(p.max_groups, sm_count);
  constexpr int kThreads = 128;
  const int blocks = (p.max_groups + kThreads - 1) / kThreads;
  fp8_setup_kernel<<<blocks, kThreads, 0, stream>>>(
      p, reinterpret_cast<Fp8Gemm::Shape3*>(ws + w.shapes),
      reinterpret_cast<const void**>(ws + w.ptr_a), reinterpret_cast<const void**>(ws + w.ptr_b),
      reinterpret_cast<uint16_t**>(ws + w.ptr_d), reinterpret_cast<const float**>(ws + w.ptr_sfa),
      reinterpret_cast<const float**>(ws + w.ptr_sfb),
      reinterpret_cast<Fp8Gemm::StrideA*>(ws + w.stride_a),
      reinterpret_cast<Fp8Gemm::StrideB*>(ws + w.stride_b),
      reinterpret_cast<Fp8Gemm::StrideD*>(ws + w.stride_d));
  QMOE_CUDA_CHECK_LAUNCH("fp8_setup_kernel");
  return initialize_and_run<typename G::Gemm>(fp8_arguments<G>(p.max_groups, sm_count, &w, ws),
                                              ws + w.cutlass, stream, "CUTLASS FP8 grouped GEMM",
                                              /*pdl=*/false);
}

}  // namespace
}  // namespace cutlass_detail

bool fp8_gemm_shape_ok(int64_t n, int64_t k, std::string* why) {
  auto fail = [why](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (k <= 0 || k % kFp8ScaleBlock != 0) {
    return fail("k = " + std::to_string(k) + " (a positive multiple of " +
                std::to_string(kFp8ScaleBlock) + ")");
  }
  if (n <= 0 || n % 8 != 0) return fail("n = " + std::to_string(n) + " (a positive multiple of 8)");
  if (n > INT32_MAX || k > INT32_MAX) return fail("n or k beyond 32 bits");
  return true;
}

size_t fp8_gemm_workspace_bytes(int64_t max_groups, int sm_count) {
  if (max_groups <= 0) return 0;
  using namespace cutlass_detail;
  return std::max({fp8_parts<Fp8Coop>(max_groups, sm_count).total,
                   fp8_parts<Fp8Ping>(max_groups, sm_count).total,
                   fp8_parts<Fp8CoopRows>(max_groups, sm_count).total,
                   fp8_parts<Fp8PingRows>(max_groups, sm_count).total});
}

Status launch_fp8_grouped_gemm(const Fp8GemmArgs& p, int sm_count, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream) {
  using namespace cutlass_detail;
  std::string why;
  if (!fp8_gemm_shape_ok(p.n, p.k, &why)) {
    return Status::invalid("launch_fp8_grouped_gemm: args: " + why);
  }
  if (p.lda < p.k || p.lda % 16 != 0) {
    return Status::invalid("launch_fp8_grouped_gemm: args.lda: expected >= k and a multiple of 16");
  }
  if (p.ldc < p.n || p.ldc % 8 != 0) {
    return Status::invalid("launch_fp8_grouped_gemm: args.ldc: expected >= n and a multiple of 8");
  }
  if (!aligned16(p.a) || !aligned16(p.c) || !aligned16(p.codes) || p.a_scales == nullptr ||
      p.w_scales == nullptr) {
    return Status::invalid(
        "launch_fp8_grouped_gemm: args: a, c and codes 16-byte aligned, scales non-null");
  }
  if (p.tile_n != 64 && p.tile_n != 128) {
    return Status::invalid("launch_fp8_grouped_gemm: args.tile_n: expected 64 or 128, got " +
                           std::to_string(p.tile_n));
  }
  if (p.max_groups <= 0 || sm_count <= 0) {
    return Status::invalid("launch_fp8_grouped_gemm: max_groups and sm_count: expected > 0");
  }
  if (p.sched.touched == nullptr || p.sched.n_touched == nullptr || p.sched.offsets == nullptr) {
    return Status::invalid("launch_fp8_grouped_gemm: args.sched: expected device pointers");
  }
  const size_t need = fp8_gemm_workspace_bytes(p.max_groups, sm_count);
  if (workspace == nullptr || workspace_bytes < need ||
      reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return Status::invalid("launch_fp8_grouped_gemm: workspace: expected " +
                           std::to_string(need) + " bytes, 256-byte aligned, got " +
                           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  }
  char* ws = static_cast<char*>(workspace);
  if (p.row_scales) {
    return p.tile_n == 64 ? launch_with<Fp8PingRows>(p, sm_count, ws, stream)
                          : launch_with<Fp8CoopRows>(p, sm_count, ws, stream);
  }
  return p.tile_n == 64 ? launch_with<Fp8Ping>(p, sm_count, ws, stream)
                        : launch_with<Fp8Coop>(p, sm_count, ws, stream);
}

}  // namespace qmoe::cuda

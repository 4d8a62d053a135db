// The CUTLASS SM90 grouped GEMM instance (types, setup kernel, launch), included once per dtype by
// cutlass_grouped_{bf16,f16}.cu. Only those translation units see CUTLASS.
//
// Configuration (the reasons; measured numbers belong in bench/results):
//   kernel   KernelPtrArrayTmaWarpSpecializedCooperative: two consumer warpgroups split one
//            128-row tile, so each holds 64 x 128 fp32 accumulators and the 128x128 tile needs no
//            register spills; one producer warp issues the TMA loads.
//   tile     128 x 128 x 64: M = 128 features is the smallest tile the cooperative schedule
//            takes; N = 128 rows keeps the padding of a ragged group (256 rows on average at 4096
//            tokens on qwen3-30b-a3b, 8 slots over 128 experts) under half a tile; K = 64 halves
//            are one 128-byte swizzle row per TMA box.
//   cluster  1 x 1 x 1: groups are small and ragged, and the scheduler rounds every group's tile
//            count up to the cluster shape, so a cluster of 2 would add empty tiles to every
//            group with one tile along M or N. The FP8 GEMM (cutlass_fp8.cu) runs clusters of
//            two along M, where the models' weight tiles come in even counts; initialize_and_run
//            launches either.
//   stages   as many as shared memory holds after the epilogue's buffers (StageCountAutoCarveout).
//
// Workspace of one launch (max_groups = G; each part starts 256-byte aligned):
//   shapes   G x Shape<int, int, int>        (n, rows of the group, k)
//   ptr_a    G x pointer                     B_g of the wave's slot
//   ptr_b    G x pointer                     a + row0 * lda
//   ptr_d    G x pointer                     c + row0 * ldc
//   stride_a, stride_b, stride_d   G x the kernel's stride types (same values in every entry)
//   cutlass  Gemm::get_workspace_size (TMA descriptors per SM)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/gemm/cutlass_instances.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "the CUTLASS grouped GEMM needs device-modifiable TMA descriptors (CUDA 12.3+, sm_90a)"
#endif

namespace qmoe::cuda::cutlass_detail {

// The epilogue does not depend on the operand type. It is named outside the template: GCC
// fails to instantiate CUTLASS's epilogue builder in a dependent context, so each tile's
// epilogue is an alias with concrete arguments at namespace scope (GroupEpilogue here, the
// mixed-input narrow tile's in cutlass_mixed_narrow.cuh).
using GroupTileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
using GroupClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
using GroupLayoutD = cutlass::layout::ColumnMajor;  // C rows [rows, ldc]: M (features) contiguous
// D = 1 * accumulators on a tile, stored as ElementD (fp32, or bf16 rows: the bf16 mixed-input
// GEMM's, cutlass_mixed.h mixed_out_dtype, and the FP8 GEMM's) in 16-byte TMA pieces; no C
// operand is read (ElementC void). Schedule: the kernel's (the FP8 GEMM's narrow tile is
// pingpong).
template <typename TileShape, typename ClusterShape = GroupClusterShape,
          typename ElementD = float,
          typename Schedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>
using GroupEpilogueFor = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, GroupLayoutD*,
    16 / sizeof(ElementD), ElementD, GroupLayoutD*, 16 / sizeof(ElementD), Schedule,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
using GroupEpilogue = GroupEpilogueFor<GroupTileShape>;
// The mainloop's stages get the shared memory the epilogue leaves (a non-dependent constant: the
// host compiler rejects the sizeof inside the template below).
constexpr int kGroupEpilogueSmem = static_cast<int>(sizeof(GroupEpilogue::SharedStorage));

template <typename Element>
struct GroupedGemm {
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using LayoutA = cutlass::layout::RowMajor;     // B_g [n, ldb]: K-contiguous along M
  using LayoutB = cutlass::layout::ColumnMajor;  // the group's A rows [rows, lda]: K-contiguous
  static constexpr int kAlignAB = 16 / sizeof(Element);  // TMA: 16-byte aligned rows
  using Epilogue = GroupEpilogue;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignAB, Element,
      LayoutB*, kAlignAB, float, GroupTileShape, GroupClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kGroupEpilogueSmem>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  // docs/cuda-backend.md's workspace formula counts 8 bytes per stride entry.
  static_assert(sizeof(StrideA) == 8 && sizeof(StrideB) == 8 && sizeof(StrideD) == 8,
                "one 64-bit leading dimension per stride");
  static_assert(sizeof(Shape3) == 12, "(M, N, K) as three ints");
};

// Byte offsets of the workspace parts (the table above).
struct WorkspaceParts {
  size_t shapes, ptr_a, ptr_b, ptr_d, stride_a, stride_b, stride_d, cutlass, total;
};

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Carves a launch's workspace into parts, in order, each 256-byte aligned.
struct WorkspaceCarver {
  size_t off = 0;
  size_t take(size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  }
};

// What every grouped GEMM's arguments share: D = 1 * accumulators with no C operand, D's
// per-group pointers (an array of the epilogue's ElementD pointers) and strides, and the grid from
// sm_count (the device id is then unused).
template <typename Arguments, typename StrideD>
void set_epilogue_and_grid(Arguments& args, void* ptr_d, StrideD* stride_d, int sm_count) {
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = static_cast<decltype(args.epilogue.ptr_D)>(ptr_d);
  args.epilogue.dD = stride_d;
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sm_count;
}

// The setup kernel: one thread per group slot j of the wave (touched index first_group + j).
// Slots past n_touched get a shape with no rows (no tiles) and valid pointers.
template <typename G>
__global__ void setup_groups_kernel(const GroupedGemmArgs p, typename G::Shape3* shapes,
                                    const void** ptr_a, const void** ptr_b, float** ptr_d,
                                    typename G::StrideA* stride_a, typename G::StrideB* stride_b,
                                    typename G::StrideD* stride_d) {
  pdl_wait();  // the plan (programmatic dependent launch, GroupedGemmArgs::pdl)
  pdl_trigger();
  const int n_touched = *p.sched.n_touched;
  const size_t elem = 2;  // bf16 / f16
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < p.max_groups;
       j += gridDim.x * blockDim.x) {
    const int64_t g = static_cast<int64_t>(p.first_group) + j;
    int rows = 0;
    int64_t row0 = 0;
    if (g < n_touched) {
      const int e = p.sched.touched[g];
      row0 = p.sched.offsets[e];
      rows = p.sched.offsets[e + 1] - p.sched.offsets[e];
    }
    shapes[j] = typename G::Shape3(static_cast<int>(p.n), rows, static_cast<int>(p.k));
    ptr_a[j] = static_cast<const char*>(p.b) + static_cast<int64_t>(j) * p.b_stride * elem;
    ptr_b[j] = static_cast<const char*>(p.a) + row0 * p.lda * elem;
    ptr_d[j] = p.c + row0 * p.ldc;
    typename G::StrideA sa{};
    cute::get<0>(sa) = p.ldb;
    stride_a[j] = sa;
    typename G::StrideB sb{};
    cute::get<0>(sb) = p.lda;
    stride_b[j] = sb;
    typename G::StrideD sd{};
    cute::get<1>(sd) = p.ldc;
    stride_d[j] = sd;
  }
}

template <typename G>
typename G::Gemm::Arguments make_arguments(int64_t max_groups, int sm_count,
                                           const WorkspaceParts* parts, char* ws) {
  using Element = typename G::Gemm::ElementA;
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  auto at = [ws](size_t off) { return ws == nullptr ? nullptr : ws + off; };
  // Host problem shapes nullptr: the grid is one CTA per SM and nothing is read on the host.
  args.problem_shape = {static_cast<int>(max_groups),
                        reinterpret_cast<typename G::Shape3*>(at(parts ? parts->shapes : 0)),
                        nullptr};
  args.mainloop.ptr_A = reinterpret_cast<const Element**>(at(parts ? parts->ptr_a : 0));
  args.mainloop.dA = reinterpret_cast<typename G::StrideA*>(at(parts ? parts->stride_a : 0));
  args.mainloop.ptr_B = reinterpret_cast<const Element**>(at(parts ? parts->ptr_b : 0));
  args.mainloop.dB = reinterpret_cast<typename G::StrideB*>(at(parts ? parts->stride_b : 0));
  set_epilogue_and_grid(args, at(parts ? parts->ptr_d : 0),
                        reinterpret_cast<typename G::StrideD*>(at(parts ? parts->stride_d : 0)),
                        sm_count);
  return args;
}

// The GEMM's entry point: CUTLASS's (device_kernel's body) with, first, the wait for the previous
// kernel (the setup kernel, whose arrays the GEMM reads first) and the trigger that lets the next
// kernel launch at once (it waits for this one's end itself). CUTLASS's SM90 ptr-array kernels
// have no grid-dependency control of their own; launched without programmatic dependent launch
// both are no-ops (pdl.cuh), so every launch goes through this one kernel. params stays a
// __grid_constant__, as the TMA descriptors in it require. kCtasPerSm: the CTAs an SM holds at
// once (CUTLASS's one, or two where the unit includes cutlass_two_ctas.cuh).
template <typename Kernel, int kCtasPerSm>
__global__ void __launch_bounds__(Kernel::MaxThreadsPerBlock, kCtasPerSm)
    pdl_gemm_kernel(CUTLASS_GRID_CONSTANT typename Kernel::Params const params) {
  pdl_wait();
  pdl_trigger();
  extern __shared__ char smem[];
  Kernel op;
  op(params, smem);
}

// What CUTLASS's device adapter does (initialize(), then run()), with pdl_gemm_kernel as the
// kernel: the workspace initialized (no stream work besides clearing CUTLASS's workspace part
// asynchronously), the parameters built on the host (TMA descriptor templates), the shared-memory
// attribute set, the launch, with programmatic dependent launch where pdl is set. All of it is
// capture-safe. `what` names the GEMM in errors. kCtasPerSm as pdl_gemm_kernel's; the arguments'
// hw_info.sm_count is then the grid (sm_count x kCtasPerSm persistent CTAs).
template <typename Gemm, int kCtasPerSm = 1>
Status initialize_and_run(const typename Gemm::Arguments& args, void* cutlass_workspace,
                          cudaStream_t stream, const char* what, bool pdl) {
  using Kernel = typename Gemm::GemmKernel;
  static_assert(kCtasPerSm >= static_cast<int>(Kernel::MinBlocksPerMultiprocessor),
                "the kernel's own residency");
  const cutlass::Status s = Kernel::initialize_workspace(args, cutlass_workspace, stream);
  if (s != cutlass::Status::kSuccess) {
    return Status::internal(std::string(what) +
                            " initialize: " + cutlass::cutlassGetStatusString(s));
  }
  const typename Kernel::Params params = Kernel::to_underlying_arguments(args, cutlass_workspace);
  auto* kernel = &pdl_gemm_kernel<Kernel, kCtasPerSm>;
  const int smem = static_cast<int>(Kernel::SharedStorageSize);
  QMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  using Cluster = typename Kernel::ClusterShape;
  const dim3 cluster(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}), cute::size<2>(Cluster{}));
  QMOE_CUDA_TRY(launch_cluster_maybe_pdl(kernel, Kernel::get_grid_shape(params),
                                         Kernel::get_block_shape(), cluster,
                                         static_cast<size_t>(smem), stream, pdl, params));
  return cuda_status(cudaGetLastError(), (std::string("launch of ") + what).c_str());
}

template <typename G>
WorkspaceParts workspace_parts(int64_t max_groups, int sm_count) {
  const size_t n = static_cast<size_t>(max_groups);
  WorkspaceParts w{};
  WorkspaceCarver c;
  auto take = [&c](size_t bytes) { return c.take(bytes); };
  w.shapes = take(n * sizeof(typename G::Shape3));
  w.ptr_a = take(n * sizeof(void*));
  w.ptr_b = take(n * sizeof(void*));
  w.ptr_d = take(n * sizeof(void*));
  w.stride_a = take(n * sizeof(typename G::StrideA));
  w.stride_b = take(n * sizeof(typename G::StrideB));
  w.stride_d = take(n * sizeof(typename G::StrideD));
  w.cutlass =
      take(G::Gemm::get_workspace_size(make_arguments<G>(max_groups, sm_count, nullptr, nullptr)));
  w.total = c.off;
  return w;
}

template <typename Element>
size_t workspace_bytes_for(int64_t max_groups, int sm_count) {
  return workspace_parts<GroupedGemm<Element>>(max_groups, sm_count).total;
}

template <typename Element>
Status launch_for(const GroupedGemmArgs& p, int sm_count, void* workspace, cudaStream_t stream) {
  using G = GroupedGemm<Element>;
  const WorkspaceParts w = workspace_parts<G>(p.max_groups, sm_count);
  char* ws = static_cast<char*>(workspace);
  constexpr int kThreads = 128;
  const int blocks = static_cast<int>((p.max_groups + kThreads - 1) / kThreads);
  QMOE_CUDA_TRY(launch_maybe_pdl(
      &setup_groups_kernel<G>, dim3(blocks), dim3(kThreads), 0, stream, p.pdl, p,
      reinterpret_cast<typename G::Shape3*>(ws + w.shapes),
      reinterpret_cast<const void**>(ws + w.ptr_a), reinterpret_cast<const void**>(ws + w.ptr_b),
      reinterpret_cast<float**>(ws + w.ptr_d),
      reinterpret_cast<typename G::StrideA*>(ws + w.stride_a),
      reinterpret_cast<typename G::StrideB*>(ws + w.stride_b),
      reinterpret_cast<typename G::StrideD*>(ws + w.stride_d)));
  QMOE_CUDA_CHECK_LAUNCH("setup_groups_kernel");

  return initialize_and_run<typename G::Gemm>(make_arguments<G>(p.max_groups, sm_count, &w, ws),
                                              ws + w.cutlass, stream, "CUTLASS grouped GEMM",
                                              p.pdl);
}

}  // namespace qmoe::cuda::cutlass_detail

// Defines the instance functions of cutlass_instances.h for one dtype.
#define QMOE_CUTLASS_GROUPED_INSTANCE(kBf16, Element)                                       \
  namespace qmoe::cuda::cutlass_detail {                                                    \
  template <>                                                                               \
  size_t instance_workspace_bytes<kBf16>(int64_t max_groups, int sm_count) {                \
    return workspace_bytes_for<Element>(max_groups, sm_count);                              \
  }                                                                                         \
  template <>                                                                               \
  Status instance_launch<kBf16>(const GroupedGemmArgs& args, int sm_count, void* workspace, \
                                cudaStream_t stream) {                                      \
    return launch_for<Element>(args, sm_count, workspace, stream);                          \
  }                                                                                         \
  }

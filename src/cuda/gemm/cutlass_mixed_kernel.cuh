// The CUTLASS SM90 mixed-input grouped GEMM instance (types, setup kernel, launch), included by
// the instance files cutlass_mixed_{int4,int8,e4m3}.cu, a few instances each. Only those
// translation units see CUTLASS.
//
// Configuration: that of cutlass_grouped_kernel.cuh (cooperative ptr-array kernel, 128 x 128 x 64
// tile, cluster 1 x 1 x 1, its column-major epilogue, with bf16 rows for bf16 activations
// (cutlass_mixed.h mixed_out_dtype) and fp32 for f16, stages from what the epilogue
// leaves), with the A operand the tuple (codes, scale[, zero]): CUTLASS's register-sourced (RS)
// mainloop loads the codes and a [128 x 1] scale (and zero) column per K tile by TMA, converts
// the codes in registers (ConvertAndScale: q * s; ConvertAndScaleWithZero: q * s + z; in f32
// where the scale is f32, then one rounding to the activation type), then issues wgmma with A
// from registers. The integer kinds' codes are shuffled at prepare (cutlass_mixed_shuffle.cuh) so
// that a thread's codes arrive in words in the order the fast conversion takes (and the decode
// path's codes serve); kE4m3 reads its codes K-contiguous.
//
// Workspace of one launch (max_groups = G; each part starts 256-byte aligned):
//   shapes   G x Shape<int, int, int>        (n, rows of the group, k)
//   ptr_a    G x pointer                     codes of the group's expert
//   ptr_b    G x pointer                     a + row0 * lda
//   ptr_d    G x pointer                     c + row0 * ldc
//   ptr_s    G x pointer                     scales of the group's expert
//   ptr_z    G x pointer                     zeros of the group's expert (null without them)
//   stride_a, stride_b, stride_d   G x 8 bytes (one 64-bit leading dimension each); a shuffled
//                                  kind's stride_a is its layout, G x 12 bytes (n / 16, k / 16
//                                  and the K step of its atoms)
//   stride_s G x 16 bytes                    (_1, n, n k / chunk)
//   cutlass  Gemm::get_workspace_size (TMA descriptors per SM: codes, activations, scales, zeros)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "cuda/common/cuda_check.h"
#include "cuda/common/sm90.h"
#include "cuda/gemm/cutlass_act_epilogue.cuh"
#include "cuda/gemm/cutlass_grouped_kernel.cuh"
#include "cuda/gemm/cutlass_mixed_instances.h"
#include "cuda/gemm/cutlass_mixed_shuffle.cuh"

namespace qmoe::cuda::cutlass_detail {

static_assert(cute::size<2>(GroupTileShape{}) == kMixedTileK, "cutlass_mixed.h's K tile");

// CUTLASS 4.2's ptr-array mixed-input collective with a zero tensor (ConvertAndScaleWithZero)
// keeps only the zero's TMA descriptor in its per-group descriptor updates, never the scale's:
// the scale load then runs on a descriptor that was never brought into shared memory, fixed up or
// fenced (an illegal instruction on the first group). This subclass adds the scale's descriptor
// to each of the four steps (bring to shared memory, rewrite address and extents per group, fence
// out, fence in) and leaves everything else to the collective. The kernel calls these through
// its mainloop type, so hiding the base's names is enough. Kinds without a zero use the
// collective as it is.
template <class Base>
struct ScaleAndZeroMainloop : Base {
  using typename Base::Params;
  using typename Base::TensorMapStorage;
  using ElementScale = typename Base::NonVoidElementScale;

  CUTLASS_DEVICE auto tensormaps_init(Params const& p, TensorMapStorage& smem, int32_t sm_count,
                                      int32_t sm_idx) {
    auto maps = Base::tensormaps_init(p, smem, sm_count, sm_idx);  // A, B, zero
    auto from = cute::make_tensor(p.tma_load_scale.get_tma_descriptor(), cute::Int<1>{},
                                  cute::Int<1>{});
    auto to = cute::make_tensor(cute::make_smem_ptr(&smem.smem_tensormap_scale), cute::Int<1>{},
                                cute::Int<1>{});
    if (cute::elect_one_sync()) {
      cute::copy(cute::recast<cute::uint128_t>(from), cute::recast<cute::uint128_t>(to));
    }
    __syncwarp();
    return maps;
  }

  template <class... Maps, class ProblemShapeMNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& smem, Params const& p,
                                                cute::tuple<Maps...> const& maps,
                                                ProblemShapeMNKL shape, int32_t next) {
    Base::tensormaps_perform_update(smem, p, maps, shape, next);  // A, B, zero
    if (cute::elect_one_sync()) {
      cute::tma_descriptor_replace_addr_in_shared_mem(smem.smem_tensormap_scale, p.ptr_S[next]);
      // The scale tensor [M, ceil(K / chunk)] with the group's stride, as the zero's (the same
      // stride dS serves both); TMA takes byte strides.
      const uint32_t m = cute::get<0>(shape), k = cute::get<2>(shape);
      cute::array<uint32_t, 5> extent = {1, 1, 1, 1, 1};
      cute::array<uint64_t, 5> stride = {0, 0, 0, 0, 0};
      ElementScale const* none = nullptr;
      auto scale = cute::make_tensor(
          cutlass::gemm::collective::detail::get_logical_ptr(none),
          cute::make_shape(m, cute::ceil_div(k, p.chunk_size), cute::Int<1>{}), p.dS[next]);
      cute::detail::fill_tma_gmem_shape_stride(p.tma_load_scale, scale, extent, stride);
      for (uint64_t& s : stride) s = s * cute::sizeof_bits_v<ElementScale> / 8;
      cute::tma_descriptor_replace_dims_strides_in_shared_mem(smem.smem_tensormap_scale, extent,
                                                              stride);
    }
  }

  template <class... Maps>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage& smem,
                                                  cute::tuple<Maps...> const& maps) {
    Base::tensormaps_cp_fence_release(smem, maps);  // waits for the rewrites; A, B, zero
    cute::tma_descriptor_cp_fence_release(cute::get<2>(maps), smem.smem_tensormap_scale);
  }

  template <class... Maps>
  CUTLASS_DEVICE void tensormaps_fence_acquire(cute::tuple<Maps...> const& maps) {
    Base::tensormaps_fence_acquire(maps);
    cute::tma_descriptor_fence_acquire(cute::get<2>(maps));
  }
};

// The tile of an instance by its M (weight rows: 128, one m64 wgmma atom per consumer warpgroup,
// or 256, two) and N (the group's rows): 128 x 128 x 64 with the grouped GEMM's epilogue here;
// the others in cutlass_mixed_{narrow,mid,tall}.cuh, each included only by its instances'
// translation units. Each epilogue is built outside any template (see
// cutlass_grouped_kernel.cuh). Two atoms per warpgroup give each consumer warp two independent
// conversion chains per k-block: the conversion's latency, not the wgmma, bounds one atom.
template <int kTileM, int kTileN, int kCtas = 1>
struct MixedTile;
// Whether an instance for activations of Element writes bf16 rows (mixed_out_dtype: bf16 layers)
// or fp32 rows (f16 layers), and its D element.
template <typename Element>
constexpr bool kMixedBf16Rows = std::is_same_v<Element, cutlass::bfloat16_t>;
template <typename Element>
using MixedElementD = std::conditional_t<kMixedBf16Rows<Element>, cutlass::bfloat16_t, float>;

// A tile: its shape and its two epilogues, fp32 rows and bf16 rows, each with the shared memory it
// takes (constants named outside templates: cutlass_grouped_kernel.cuh says why); an instance
// takes the one its rows need (kMixedBf16Rows). kCtas: CTAs per SM (2 only in the unit that
// includes cutlass_two_ctas.cuh first).
template <typename TileShape, typename F32Epilogue, int kF32Smem, typename Bf16Epilogue,
          int kBf16Smem, int kCtas = 1>
struct MixedTileOf {
  using Shape = TileShape;
  static constexpr int kCtasPerSm = kCtas;
  template <typename Element>
  using Epilogue = std::conditional_t<kMixedBf16Rows<Element>, Bf16Epilogue, F32Epilogue>;
  template <typename Element>
  static constexpr int kEpilogueSmem = kMixedBf16Rows<Element> ? kBf16Smem : kF32Smem;
};

using WideEpilogueBf16 = GroupEpilogueFor<GroupTileShape, GroupClusterShape, cutlass::bfloat16_t>;
constexpr int kWideEpilogueBf16Smem = static_cast<int>(sizeof(WideEpilogueBf16::SharedStorage));
template <>
struct MixedTile<128, 128> : MixedTileOf<GroupTileShape, GroupEpilogue, kGroupEpilogueSmem,
                                         WideEpilogueBf16, kWideEpilogueBf16Smem> {};

// Code type, scale type and zero term of each kind (cutlass_mixed.h's table); Element is the
// activation type.
template <MixedCodes kCodes, typename Element>
struct MixedOperand;
template <typename Element>
struct MixedOperand<MixedCodes::kInt4, Element> {
  using Tuple = cute::tuple<cutlass::int4b_t, Element>;
};
template <typename Element>
struct MixedOperand<MixedCodes::kInt4Zero, Element> {
  using Tuple = cute::tuple<cutlass::int4b_t, float, float>;
};
template <typename Element>
struct MixedOperand<MixedCodes::kInt8Zero, Element> {
  using Tuple = cute::tuple<int8_t, float, float>;
};
template <typename Element>
struct MixedOperand<MixedCodes::kE4m3, Element> {
  using Tuple = cute::tuple<cutlass::float_e4m3_t, float>;
};
template <typename Element>
struct MixedOperand<MixedCodes::kInt8, Element> {
  using Tuple = cute::tuple<int8_t, Element>;
};

// CUTLASS's grouped kernels hold 1 KB of static shared memory besides their dynamic SharedStorage
// (cuobjdump -res-usage: SHARED 1024). The dynamic shared memory one CTA may hold when `ctas` of
// them share an SM: the opt-in limit alone, or the SM's share less the system's and the static.
constexpr size_t kCutlassStaticSmem = 1024;
constexpr size_t mixed_smem_per_cta(int ctas) {
  return ctas == 1 ? kSm90SmemPerBlockOptin
                   : kSm90SmemPerSm / ctas - kSm90SmemReservedPerBlock - kCutlassStaticSmem;
}

// Whether Kernel may run two CTAs per SM (cutlass_two_ctas.cuh): only in a unit that includes
// that header first, on a kernel whose register counts are the ones it replaces, within half the
// SM's shared memory.
template <typename Kernel>
struct MixedFitsTwoCtas {
#ifdef QMOE_CUTLASS_TWO_CTAS_PER_SM
  static constexpr bool kUnit = true;
  static constexpr bool value = Kernel::MaxThreadsPerBlock == kTwoCtasThreads &&
                                Kernel::LoadRegisterRequirement == kCutlassLoadRegs &&
                                Kernel::MmaRegisterRequirement == kCutlassMainloopRegs &&
                                Kernel::SharedStorageSize <= mixed_smem_per_cta(2);
#else
  static constexpr bool kUnit = false;
  static constexpr bool value = false;
#endif
};

// kAct: FC1 with the gated activation in its epilogue (cutlass_act_epilogue.cuh: no shared
// memory, so the mainloop's stages take all of it), else the tile's epilogue for Element's rows
// (bf16 for bf16 activations, fp32 for f16: MixedElementD).
template <MixedCodes kCodes, typename Element, int kTileM, int kTileN, bool kActEpilogue = false,
          int kCtas = 1>
struct MixedGemm {
  static constexpr bool kAct = kActEpilogue;
  using Operand = MixedOperand<kCodes, Element>;
  using Tile = MixedTile<kTileM, kTileN, kCtas>;
  using Epilogue =
      std::conditional_t<kAct, ActEpilogue<Element>, typename Tile::template Epilogue<Element>>;
  static constexpr int kEpilogueSmem = kAct ? 0 : Tile::template kEpilogueSmem<Element>;
  // Two CTAs per SM: each keeps to its half of the SM's shared memory (the stages leave the
  // rest: CUTLASS's stage count fills the opt-in limit minus the carve-out).
  static constexpr int kCtasPerSm = Tile::kCtasPerSm;
  static_assert(kCtasPerSm == 1 || kCtasPerSm == 2, "one or two CTAs per SM");
  static constexpr int kSmemCarveout = static_cast<int>(
      kEpilogueSmem + kSm90SmemPerBlockOptin - mixed_smem_per_cta(kCtasPerSm));
  // The rows' element: the activation's (act_out) with kAct, else MixedElementD.
  static constexpr size_t kOutBytes = kAct ? sizeof(Element) : sizeof(MixedElementD<Element>);
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using LayoutB = cutlass::layout::ColumnMajor;      // the group's A rows [rows, lda]: K-contiguous
  static constexpr bool kShuffled = mixed_codes_shuffled(kCodes);
  static constexpr int kBits = mixed_code_bits(kCodes);
  // codes [n, k]: K-contiguous along M, or the shuffled layout (the collective takes a CuTe layout
  // in place of the stride).
  using PlainStrideA = cute::remove_pointer_t<
      cutlass::detail::TagToStrideA_t<cutlass::layout::RowMajor*>>;
  using LayoutA = std::conditional_t<kShuffled, ShuffledLayoutA<PlainStrideA, kBits>,
                                     cutlass::layout::RowMajor>;
  static constexpr int kAlignA = 128 / kBits;  // TMA: 16-byte rows of codes
  static constexpr int kAlignB = 16 / sizeof(Element);
  using Collective = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Operand::Tuple, LayoutA*,
      kAlignA, Element, LayoutB*, kAlignB, float, typename Tile::Shape, GroupClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kSmemCarveout>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  static constexpr bool kZero = mixed_has_zeros(kCodes);
  using Mainloop =
      std::conditional_t<kZero, ScaleAndZeroMainloop<Collective>, Collective>;
  static_assert(Mainloop::KernelConversionMode ==
                    (kZero ? Mainloop::ConversionMode::ConvertAndScaleWithZero
                           : Mainloop::ConversionMode::ConvertAndScale),
                "codes times scales, plus the zero term where the kind has one");

  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static_assert(kCtasPerSm == 1 || MixedFitsTwoCtas<Kernel>::value,
                "two CTAs per SM: the unit includes cutlass_two_ctas.cuh first, CUTLASS asks "
                "for its register counts, and a CTA fits in half the SM's shared memory");
  static_assert(kCtasPerSm == 2 || !MixedFitsTwoCtas<Kernel>::kUnit,
                "a one-CTA tile in the two-CTA unit would run its consumers at 96 registers");
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using StrideS = typename Mainloop::StrideScale;
  // docs/cuda-backend.md's workspace formula counts these sizes.
  static_assert(sizeof(StrideA) == (kShuffled ? 12 : 8) && sizeof(StrideB) == 8 &&
                    sizeof(StrideD) == 8,
                "one 64-bit leading dimension per stride; the shuffled layout's three ints");
  static_assert(sizeof(StrideS) == 16, "scale stride (_1, int64, int64)");
  static_assert(sizeof(Shape3) == 12, "(M, N, K) as three ints");
  static constexpr int64_t kScaleBytes = mixed_scale_bytes(kCodes);
};

struct MixedParts {
  size_t shapes, ptr_a, ptr_b, ptr_d, ptr_s, ptr_z, stride_a, stride_b, stride_d, stride_s, cutlass,
      total;
};

// The group arrays of a launch (group_setup.h) in G's types: the per-slot pointers and shape in
// bytes, and each stride type's bytes as built here, copied into every slot.
template <typename T>
GroupConst group_const(void* at, const T& value) {
  static_assert(sizeof(T) % 4 == 0 && sizeof(T) <= 16 && std::is_trivially_copyable_v<T>,
                "a stride of one to four 32-bit words");
  GroupConst c;
  c.at = static_cast<uint32_t*>(at);
  c.words = static_cast<int>(sizeof(T) / 4);
  std::memcpy(c.value, &value, sizeof(T));
  return c;
}

template <typename G>
GroupSetup mixed_group_setup(const MixedGemmArgs& p, const MixedParts& w, char* ws) {
  static_assert(sizeof(typename G::Shape3) == 3 * sizeof(int32_t), "(n, rows, k)");
  const int64_t elem = 2;  // bf16 / f16 activations
  const int64_t kb = p.k / p.chunk;
  GroupSetup g;
  g.max_groups = p.max_groups;
  g.shapes = reinterpret_cast<int32_t*>(ws + w.shapes);
  g.ptr_a = reinterpret_cast<const void**>(ws + w.ptr_a);
  g.ptr_b = reinterpret_cast<const void**>(ws + w.ptr_b);
  g.ptr_d = reinterpret_cast<void**>(ws + w.ptr_d);
  g.ptr_s = reinterpret_cast<const void**>(ws + w.ptr_s);
  g.ptr_z = reinterpret_cast<const void**>(ws + w.ptr_z);
  g.n = static_cast<int32_t>(p.n);
  g.k = static_cast<int32_t>(p.k);
  g.a = reinterpret_cast<const char*>(p.codes);
  g.a_expert = p.n * (p.k * G::kBits / 8);
  g.b = static_cast<const char*>(p.a);
  g.b_row = p.lda * elem;
  // The activation epilogue's rows are the activation dtype's (its pointers share the slot).
  g.d = static_cast<char*>(G::kAct ? p.act_out : p.c);
  g.d_row = (G::kAct ? p.ld_act : p.ldc) * G::kOutBytes;
  g.s = static_cast<const char*>(p.scales);
  g.s_expert = kb * p.n * G::kScaleBytes;
  g.z = G::kZero ? reinterpret_cast<const char*>(p.zeros) : nullptr;
  g.z_expert = kb * p.n * static_cast<int64_t>(sizeof(float));
  typename G::StrideA sa{};
  if constexpr (G::kShuffled) {
    sa = shuffled_layout<G::kBits>(static_cast<int>(p.n), static_cast<int>(p.k));
  } else {
    cute::get<0>(sa) = p.k;  // in codes; CUTLASS turns it into bytes
  }
  typename G::StrideB sb{};
  cute::get<0>(sb) = p.lda;
  typename G::StrideD sd{};
  cute::get<1>(sd) = p.ldc;
  typename G::StrideS ss{};
  cute::get<1>(ss) = p.n;
  cute::get<2>(ss) = kb * p.n;
  g.consts[0] = group_const(ws + w.stride_a, sa);
  g.consts[1] = group_const(ws + w.stride_b, sb);
  g.consts[2] = group_const(ws + w.stride_d, sd);
  g.consts[3] = group_const(ws + w.stride_s, ss);
  return g;
}

template <typename G>
typename G::Gemm::Arguments make_mixed_arguments(int64_t max_groups, int64_t chunk, int sm_count,
                                                 const MixedParts* parts, char* ws,
                                                 const MixedGemmArgs* p = nullptr) {
  typename G::Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  auto at = [ws, parts](size_t MixedParts::*part) {
    return ws == nullptr || parts == nullptr ? nullptr : ws + parts->*part;
  };
  // Host problem shapes nullptr: the grid is kCtasPerSm CTAs per SM (CUTLASS's persistent
  // scheduler launches hw_info.sm_count CTAs; its TMA descriptors in the workspace are per CTA)
  // and nothing is read on the host.
  sm_count *= G::kCtasPerSm;
  args.problem_shape = {static_cast<int>(max_groups),
                        reinterpret_cast<typename G::Shape3*>(at(&MixedParts::shapes)), nullptr};
  auto& m = args.mainloop;
  m.ptr_A = reinterpret_cast<decltype(m.ptr_A)>(at(&MixedParts::ptr_a));
  m.dA = reinterpret_cast<decltype(m.dA)>(at(&MixedParts::stride_a));
  m.ptr_B = reinterpret_cast<decltype(m.ptr_B)>(at(&MixedParts::ptr_b));
  m.dB = reinterpret_cast<decltype(m.dB)>(at(&MixedParts::stride_b));
  m.ptr_S = reinterpret_cast<decltype(m.ptr_S)>(at(&MixedParts::ptr_s));
  m.dS = reinterpret_cast<decltype(m.dS)>(at(&MixedParts::stride_s));
  if constexpr (G::kZero) m.ptr_Z = reinterpret_cast<decltype(m.ptr_Z)>(at(&MixedParts::ptr_z));
  m.chunk_size = static_cast<int>(chunk);
  if constexpr (G::kAct) {
    args.epilogue.ptr_out = reinterpret_cast<void* const*>(at(&MixedParts::ptr_d));
    if (p != nullptr) args.epilogue.ld_out = p->ld_act, args.epilogue.act = p->act;
    args.hw_info.device_id = 0;
    args.hw_info.sm_count = sm_count;
  } else {
    set_epilogue_and_grid(args, at(&MixedParts::ptr_d),
                          reinterpret_cast<typename G::StrideD*>(at(&MixedParts::stride_d)),
                          sm_count);
  }
  return args;
}

template <typename G>
MixedParts mixed_parts(int64_t max_groups, int sm_count) {
  const size_t n = static_cast<size_t>(max_groups);
  MixedParts w{};
  WorkspaceCarver c;
  auto take = [&c](size_t bytes) { return c.take(bytes); };
  w.shapes = take(n * sizeof(typename G::Shape3));
  w.ptr_a = take(n * sizeof(void*));
  w.ptr_b = take(n * sizeof(void*));
  w.ptr_d = take(n * sizeof(void*));
  w.ptr_s = take(n * sizeof(void*));
  w.ptr_z = take(n * sizeof(void*));
  w.stride_a = take(n * sizeof(typename G::StrideA));
  w.stride_b = take(n * sizeof(typename G::StrideB));
  w.stride_d = take(n * sizeof(typename G::StrideD));
  w.stride_s = take(n * sizeof(typename G::StrideS));
  w.cutlass = take(G::Gemm::get_workspace_size(
      make_mixed_arguments<G>(max_groups, kMixedTileK, sm_count, nullptr, nullptr)));
  w.total = c.off;
  return w;
}

template <MixedCodes kCodes, typename Element, int kTileM, int kTileN, bool kAct, int kCtas>
size_t mixed_workspace_bytes_for(int64_t max_groups, int sm_count) {
  return mixed_parts<MixedGemm<kCodes, Element, kTileM, kTileN, kAct, kCtas>>(max_groups, sm_count)
      .total;
}

template <MixedCodes kCodes, typename Element, int kTileM, int kTileN, bool kAct, int kCtas>
Status mixed_launch_for(const MixedGemmArgs& p, int sm_count, void* workspace,
                        cudaStream_t stream) {
  using G = MixedGemm<kCodes, Element, kTileM, kTileN, kAct, kCtas>;
  const MixedParts w = mixed_parts<G>(p.max_groups, sm_count);
  char* ws = static_cast<char*>(workspace);
  // Another kernel wrote the group arrays (MixedGemmArgs::setup_written), else the setup kernel.
  if (!p.setup_written) {
    QMOE_RETURN_IF_ERROR(
        launch_group_setup(mixed_group_setup<G>(p, w, ws), p.sched, stream, p.pdl));
  }

  return initialize_and_run<typename G::Gemm, G::kCtasPerSm>(
      make_mixed_arguments<G>(p.max_groups, p.chunk, sm_count, &w, ws, &p), ws + w.cutlass, stream,
      "CUTLASS mixed-input GEMM", p.pdl);
}

template <MixedCodes kCodes, typename Element, int kTileM, int kTileN, bool kAct, int kCtas>
GroupSetup mixed_setup_for(const MixedGemmArgs& p, int sm_count, void* workspace) {
  using G = MixedGemm<kCodes, Element, kTileM, kTileN, kAct, kCtas>;
  return mixed_group_setup<G>(p, mixed_parts<G>(p.max_groups, sm_count),
                              static_cast<char*>(workspace));
}

template <MixedCodes kCodes, typename Element, int kTileM, int kTileN, bool kAct, int kCtas>
Status mixed_residency_for(int* resident) {
  using G = MixedGemm<kCodes, Element, kTileM, kTileN, kAct, kCtas>;
  using Kernel = typename G::Kernel;
  auto* kernel = &pdl_gemm_kernel<Kernel, G::kCtasPerSm>;
  const int smem = static_cast<int>(Kernel::SharedStorageSize);
  QMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  QMOE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      resident, kernel, static_cast<int>(Kernel::MaxThreadsPerBlock), smem));
  return Status::ok();
}

}  // namespace qmoe::cuda::cutlass_detail

// Defines the instance functions of cutlass_mixed_instances.h for one kind, dtype, tile, epilogue
// and residency (the host picks an instance by its N alone: each kind and dtype has one M per N).
#define QMOE_CUTLASS_MIXED_INSTANCE(kCodes, kBf16, kTileM, kTileN, kAct, kCtas, Element)           \
  namespace qmoe::cuda::cutlass_detail {                                                           \
  template <>                                                                                      \
  size_t mixed_workspace_bytes<kCodes, kBf16, kTileN, kAct, kCtas>(int64_t max_groups,             \
                                                                   int sm_count) {                 \
    return mixed_workspace_bytes_for<kCodes, Element, kTileM, kTileN, kAct, kCtas>(max_groups,     \
                                                                                   sm_count);      \
  }                                                                                                \
  template <>                                                                                      \
  Status mixed_launch<kCodes, kBf16, kTileN, kAct, kCtas>(const MixedGemmArgs& args, int sm_count, \
                                                          void* workspace, cudaStream_t stream) {  \
    return mixed_launch_for<kCodes, Element, kTileM, kTileN, kAct, kCtas>(args, sm_count,          \
                                                                          workspace, stream);      \
  }                                                                                                \
  template <>                                                                                      \
  GroupSetup mixed_setup<kCodes, kBf16, kTileN, kAct, kCtas>(const MixedGemmArgs& args,            \
                                                             int sm_count, void* workspace) {      \
    return mixed_setup_for<kCodes, Element, kTileM, kTileN, kAct, kCtas>(args, sm_count,           \
                                                                         workspace);               \
  }                                                                                                \
  template <>                                                                                      \
  Status mixed_residency<kCodes, kBf16, kTileN, kAct, kCtas>(int* resident) {                      \
    return mixed_residency_for<kCodes, Element, kTileM, kTileN, kAct, kCtas>(resident);            \
  }                                                                                                \
  }

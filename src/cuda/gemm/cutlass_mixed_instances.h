// The mixed-input instances behind cutlass_mixed.h, defined by one translation unit per family of
// code kinds (cutlass_mixed_int4.cu: kInt4, kInt4Zero; cutlass_mixed_int8.cu: kInt8, kInt8Zero;
// cutlass_mixed_e4m3.cu), the only ones that include CUTLASS; the three compile in parallel.
// kBf16: bf16 activations, else f16; kTileN: the tile's rows.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/gemm/group_setup.h"
#include "qmoe/status.h"

namespace qmoe::cuda::cutlass_detail {

template <MixedCodes kCodes, bool kBf16, int kTileN, bool kAct, int kCtas>
size_t mixed_workspace_bytes(int64_t max_groups, int sm_count);

// Arguments already validated (mixed_gemm_can_implement) and the workspace size checked.
template <MixedCodes kCodes, bool kBf16, int kTileN, bool kAct, int kCtas>
Status mixed_launch(const MixedGemmArgs& args, int sm_count, void* workspace, cudaStream_t stream);

// The group arrays the launch's setup kernel writes (group_setup.h), for another kernel to write.
template <MixedCodes kCodes, bool kBf16, int kTileN, bool kAct, int kCtas>
GroupSetup mixed_setup(const MixedGemmArgs& args, int sm_count, void* workspace);

// How many CTAs of the instance the device holds per SM at once (the occupancy API).
template <MixedCodes kCodes, bool kBf16, int kTileN, bool kAct, int kCtas>
Status mixed_residency(int* resident);

// The instance list: each entry is defined (explicitly specialized) by its translation unit and
// declared here before any use; the host dispatch in cutlass_mixed.cu walks the same list. The
// narrow tile (32 rows) exists for bf16 (every kind) and for f16 kE4m3 (MXFP4's copy: gpt-oss
// ships f16 too) (each instance adds compile time, docs/cuda-backend.md); f16 layers of the
// other kinds run the 128-row tile at every size. The middle (64 rows) tile exists for bf16
// kInt4 and kInt4Zero and for kE4m3.
// kAct: FC1 with the gated activation in its epilogue (cutlass_act_epilogue.cuh), on the narrow
// tile of bf16 kInt4 and kInt8 only: on the taller tiles the epilogue's activation and stores,
// run by the consumer warps that bound the kernel, cost more than the activation kernel they
// replace (bench/results/2026-12-04-h200-act-epilogue.md).
// kCtas: CTAs per SM. The narrow tile has both: two (cutlass_two_ctas.cuh, the unit
// cutlass_mixed_narrow.cu) where the FC has enough tiles to fill them, one where it has fewer
// (mixed_ctas_per_sm: each CTA of two holds half the stages).
#define QMOE_MIXED_INSTANCES(X)                  \
  X(MixedCodes::kInt4, true, 128, false, 1)      \
  X(MixedCodes::kInt4, false, 128, false, 1)     \
  X(MixedCodes::kInt4Zero, true, 128, false, 1)  \
  X(MixedCodes::kInt4Zero, false, 128, false, 1) \
  X(MixedCodes::kInt8Zero, true, 128, false, 1)  \
  X(MixedCodes::kInt8Zero, false, 128, false, 1) \
  X(MixedCodes::kE4m3, true, 128, false, 1)      \
  X(MixedCodes::kE4m3, false, 128, false, 1)     \
  X(MixedCodes::kInt8, true, 128, false, 1)      \
  X(MixedCodes::kInt8, false, 128, false, 1)     \
  X(MixedCodes::kInt4, true, 32, false, 1)       \
  X(MixedCodes::kInt8, true, 32, false, 1)       \
  X(MixedCodes::kE4m3, true, 32, false, 1)       \
  X(MixedCodes::kInt4Zero, true, 32, false, 1)   \
  X(MixedCodes::kInt8Zero, true, 32, false, 1)   \
  X(MixedCodes::kInt4, true, 64, false, 1)       \
  X(MixedCodes::kInt4Zero, true, 64, false, 1)   \
  X(MixedCodes::kE4m3, true, 64, false, 1)       \
  X(MixedCodes::kE4m3, false, 64, false, 1)      \
  X(MixedCodes::kE4m3, false, 32, false, 1)      \
  X(MixedCodes::kInt4, true, 32, true, 1)        \
  X(MixedCodes::kInt8, true, 32, true, 1)        \
  X(MixedCodes::kInt4, true, 32, false, 2)       \
  X(MixedCodes::kInt4, true, 32, true, 2)        \
  X(MixedCodes::kInt8, true, 32, false, 2)       \
  X(MixedCodes::kInt8, true, 32, true, 2)        \
  X(MixedCodes::kE4m3, true, 32, false, 2)       \
  X(MixedCodes::kInt4Zero, true, 32, false, 2)   \
  X(MixedCodes::kInt8Zero, true, 32, false, 2)   \
  X(MixedCodes::kE4m3, false, 32, false, 2)      \
  X(MixedCodes::kInt4, true, 144, false, 1)      \
  X(MixedCodes::kInt8, true, 144, false, 1)      \
  X(MixedCodes::kE4m3, true, 144, false, 1)      \
  X(MixedCodes::kInt4Zero, true, 144, false, 1)  \
  X(MixedCodes::kInt8Zero, true, 144, false, 1)

#define QMOE_MIXED_DECLARE(kCodes, kBf16, kTileN, kAct, kCtas)                                     \
  template <>                                                                                      \
  size_t mixed_workspace_bytes<kCodes, kBf16, kTileN, kAct, kCtas>(int64_t max_groups,             \
                                                                   int sm_count);                  \
  template <>                                                                                      \
  Status mixed_launch<kCodes, kBf16, kTileN, kAct, kCtas>(const MixedGemmArgs& args, int sm_count, \
                                                          void* workspace, cudaStream_t stream);   \
  template <>                                                                                      \
  GroupSetup mixed_setup<kCodes, kBf16, kTileN, kAct, kCtas>(const MixedGemmArgs& args,            \
                                                             int sm_count, void* workspace);       \
  template <>                                                                                      \
  Status mixed_residency<kCodes, kBf16, kTileN, kAct, kCtas>(int* resident);
QMOE_MIXED_INSTANCES(QMOE_MIXED_DECLARE)
#undef QMOE_MIXED_DECLARE

}  // namespace qmoe::cuda::cutlass_detail

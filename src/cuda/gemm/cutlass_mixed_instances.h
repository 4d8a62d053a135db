// The mixed-input instances behind cutlass_mixed.h, one translation unit per code kind and
// activation dtype (cutlass_mixed_<kind>_<dtype>.cu) so that each compiles once, in parallel, and
// only they include CUTLASS. kBf16: bf16 activations, else f16.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm/cutlass_mixed.h"
#include "qmoe/status.h"

namespace qmoe::cuda::cutlass_detail {

template <MixedCodes kCodes, bool kBf16>
size_t mixed_workspace_bytes(int64_t max_groups, int sm_count);

// Arguments already validated (mixed_gemm_can_implement) and the workspace size checked.
template <MixedCodes kCodes, bool kBf16>
Status mixed_launch(const MixedGemmArgs& args, int sm_count, void* workspace, cudaStream_t stream);

// The instance list: each entry is defined (explicitly specialized) by its translation unit and
// declared here before any use; the host dispatch in cutlass_mixed.cu walks the same list.
#define QMOE_MIXED_INSTANCES(X)        \
  X(MixedCodes::kInt4, true)           \
  X(MixedCodes::kInt4, false)          \
  X(MixedCodes::kInt4Zero, true)       \
  X(MixedCodes::kInt4Zero, false)      \
  X(MixedCodes::kUint8, true)          \
  X(MixedCodes::kUint8, false)         \
  X(MixedCodes::kE4m3, true)           \
  X(MixedCodes::kE4m3, false)

#define QMOE_MIXED_DECLARE(kCodes, kBf16)                                                  \
  template <>                                                                              \
  size_t mixed_workspace_bytes<kCodes, kBf16>(int64_t max_groups, int sm_count);           \
  template <>                                                                              \
  Status mixed_launch<kCodes, kBf16>(const MixedGemmArgs& args, int sm_count, void* workspace, \
                                     cudaStream_t stream);
QMOE_MIXED_INSTANCES(QMOE_MIXED_DECLARE)
#undef QMOE_MIXED_DECLARE

}  // namespace qmoe::cuda::cutlass_detail

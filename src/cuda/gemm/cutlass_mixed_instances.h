// The per-dtype mixed-input instances behind cutlass_mixed.h, one translation unit each
// (cutlass_mixed_bf16.cu, cutlass_mixed_f16.cu) so that each compiles once, in parallel, and only
// they include CUTLASS. kBf16: bf16 activations and scales, else f16.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm/cutlass_mixed.h"
#include "qmoe/status.h"

namespace qmoe::cuda::cutlass_detail {

template <bool kBf16>
size_t mixed_workspace_bytes(int64_t max_groups, int sm_count);

// Arguments already validated (mixed_gemm_can_implement) and the workspace size checked.
template <bool kBf16>
Status mixed_launch(const MixedGemmArgs& args, int sm_count, void* workspace, cudaStream_t stream);

// Defined by the instance files (explicit specializations, declared here before any use).
template <>
size_t mixed_workspace_bytes<true>(int64_t max_groups, int sm_count);
template <>
size_t mixed_workspace_bytes<false>(int64_t max_groups, int sm_count);
template <>
Status mixed_launch<true>(const MixedGemmArgs& args, int sm_count, void* workspace,
                          cudaStream_t stream);
template <>
Status mixed_launch<false>(const MixedGemmArgs& args, int sm_count, void* workspace,
                           cudaStream_t stream);

}  // namespace qmoe::cuda::cutlass_detail

// The per-dtype CUTLASS grouped GEMM instances behind cutlass_grouped.h, both defined by
// cutlass_grouped_instances.cu, the only translation unit of the two that includes CUTLASS.
// kBf16: bf16 operands, else f16.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm/grouped_gemm.h"
#include "qmoe/status.h"

namespace qmoe::cuda::cutlass_detail {

template <bool kBf16>
size_t instance_workspace_bytes(int64_t max_groups, int sm_count);

// Arguments already validated (cutlass_gemm_can_implement) and the workspace size checked.
template <bool kBf16>
Status instance_launch(const GroupedGemmArgs& args, int sm_count, void* workspace,
                       cudaStream_t stream);

// Defined by the instance files (explicit specializations, declared here before any use).
template <>
size_t instance_workspace_bytes<true>(int64_t max_groups, int sm_count);
template <>
size_t instance_workspace_bytes<false>(int64_t max_groups, int sm_count);
template <>
Status instance_launch<true>(const GroupedGemmArgs& args, int sm_count, void* workspace,
                             cudaStream_t stream);
template <>
Status instance_launch<false>(const GroupedGemmArgs& args, int sm_count, void* workspace,
                              cudaStream_t stream);

}  // namespace qmoe::cuda::cutlass_detail

// The CUTLASS grouped GEMM's instances (cutlass_grouped_kernel.cuh), bf16 and f16 operands, in one
// translation unit: CUTLASS's headers are parsed once for both (cutlass_mixed_int4.cu).
#include "cuda/gemm/cutlass_grouped_kernel.cuh"

QMOE_CUTLASS_GROUPED_INSTANCE(true, cutlass::bfloat16_t)
QMOE_CUTLASS_GROUPED_INSTANCE(false, cutlass::half_t)

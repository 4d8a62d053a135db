// The CUTLASS grouped GEMM for bf16 operands (cutlass_grouped_kernel.cuh).
#include "cuda/gemm/cutlass_grouped_kernel.cuh"

QMOE_CUTLASS_GROUPED_INSTANCE(true, cutlass::bfloat16_t)

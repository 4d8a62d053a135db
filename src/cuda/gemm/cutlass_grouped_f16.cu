// The CUTLASS grouped GEMM for f16 operands (cutlass_grouped_kernel.cuh).
#include "cuda/gemm/cutlass_grouped_kernel.cuh"

QMOE_CUTLASS_GROUPED_INSTANCE(false, cutlass::half_t)

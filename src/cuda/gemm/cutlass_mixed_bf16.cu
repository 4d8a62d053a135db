// The mixed-input grouped GEMM for bf16 activations (cutlass_mixed_kernel.cuh).
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(true, cutlass::bfloat16_t)

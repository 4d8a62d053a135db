// The mixed-input grouped GEMM, int4zero codes, f16 activations (cutlass_mixed_kernel.cuh).
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, false, cutlass::half_t)

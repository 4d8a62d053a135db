// The mixed-input grouped GEMM, int4 codes, f16 activations (cutlass_mixed_kernel.cuh).
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, false, cutlass::half_t)

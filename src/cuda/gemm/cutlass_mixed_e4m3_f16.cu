// The mixed-input grouped GEMM, e4m3 codes, f16 activations (cutlass_mixed_kernel.cuh).
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, false, cutlass::half_t)

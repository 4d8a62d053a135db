// The mixed-input grouped GEMM: int4zero codes, f16 activations, 128 x 128 tile.
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, false, 128, 128, cutlass::half_t)

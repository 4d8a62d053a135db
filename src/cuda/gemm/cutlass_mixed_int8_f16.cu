// The mixed-input grouped GEMM: signed int8 codes (shuffled), f16 activations, 128 x 128 tile.
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, false, 128, 128, cutlass::half_t)

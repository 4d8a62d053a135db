// The mixed-input grouped GEMM: int4 codes, bf16 activations, 64-row tile.
#include "cuda/gemm/cutlass_mixed_mid.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 64, cutlass::bfloat16_t)

// The mixed-input grouped GEMM: int4 codes, bf16 activations, 256 x 32 tile.
#include "cuda/gemm/cutlass_mixed_narrow.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 32, cutlass::bfloat16_t)

// The mixed-input grouped GEMM: int4 codes, bf16 activations, 128 x 256 tile.
#include "cuda/gemm/cutlass_mixed_wide.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 128, 256, cutlass::bfloat16_t)

// The mixed-input grouped GEMM: e4m3 codes, bf16 activations, 256 x 128 tile.
#include "cuda/gemm/cutlass_mixed_tall.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, true, 256, 128, cutlass::bfloat16_t)

// The mixed-input grouped GEMM: signed int8 codes (shuffled), bf16 activations, 256 x 128 tile.
#include "cuda/gemm/cutlass_mixed_tall.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 256, 128, cutlass::bfloat16_t)

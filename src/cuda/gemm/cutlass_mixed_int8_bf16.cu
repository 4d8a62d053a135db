// The mixed-input grouped GEMM: signed int8 codes (shuffled), bf16 activations, 128-row tile.
#include "cuda/gemm/cutlass_mixed_kernel.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 128, cutlass::bfloat16_t)

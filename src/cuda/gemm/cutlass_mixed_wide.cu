// The mixed-input grouped GEMM's wide-tile instances (256 x 144, cutlass_mixed_wide.cuh) with
// bf16 activations, every kind (those of the 256 x 128 tile). Their own unit because the 144-row
// wgmma is one of CuTe's extended shapes, enabled here before any CUTLASS header; the other units'
// tiles select the same wgmma with or without it (CuTe's selector tries each N from 256 down and
// takes the first that divides the tile's, and no extended N below 256 divides 32, 64 or 128 ahead
// of them).
// clang-format off
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1
#include "cuda/gemm/cutlass_mixed_wide.cuh"
// clang-format on

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 144, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 256, 144, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, true, 256, 144, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, true, 256, 144, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8Zero, true, 256, 144, false, 1, cutlass::bfloat16_t)

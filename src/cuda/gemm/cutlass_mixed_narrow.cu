// The mixed-input grouped GEMM's narrow-tile instances at two CTAs per SM (256 x 32,
// cutlass_mixed_narrow.cuh) of every kind that has the tile: kInt4 and kInt8 with bf16
// activations, each also with FC1's activation in the epilogue (cutlass_act_epilogue.cuh),
// kInt4Zero and kInt8Zero with bf16, and kE4m3 with bf16 and f16. They share a unit because two
// CTAs per SM take cutlass_two_ctas.cuh before any CUTLASS header; no one-CTA instance may be
// built here (its consumers would get 96 registers; MixedGemm refuses it). The one-CTA narrow
// instances are in the kind units.
// The two-CTA header first, before any CUTLASS header.
// clang-format off
#include "cuda/gemm/cutlass_two_ctas.cuh"
#include "cuda/gemm/cutlass_mixed_narrow.cuh"
// clang-format on

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 32, false, 2, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 32, true, 2, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 256, 32, false, 2, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8, true, 256, 32, true, 2, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, true, 256, 32, false, 2, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, true, 256, 32, false, 2, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt8Zero, true, 256, 32, false, 2, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kE4m3, false, 256, 32, false, 2, cutlass::half_t)

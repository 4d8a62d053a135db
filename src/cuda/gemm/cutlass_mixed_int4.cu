// The mixed-input grouped GEMM's int4 instances (cutlass_mixed_instances.h): kInt4 and kInt4Zero
// with bf16 activations on the 256 x 128 and 256 x 64 tiles, and with f16 on 128 x 128; the
// narrow tile (256 x 32) at one CTA per SM, kInt4's with and without the activation epilogue (at
// two: cutlass_mixed_narrow.cu).
//
// The instances are grouped by kind, a few per translation unit: nvcc's front end parses
// CUTLASS's headers once per unit, and that is most of a unit's compile time (one instance alone
// 68 s of CPU, two in one unit 77 s; docs/cuda-backend.md).
#include "cuda/gemm/cutlass_mixed_mid.cuh"
#include "cuda/gemm/cutlass_mixed_narrow.cuh"
#include "cuda/gemm/cutlass_mixed_tall.cuh"

QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 128, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 64, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, false, 128, 128, false, 1, cutlass::half_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, true, 256, 128, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, true, 256, 64, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, false, 128, 128, false, 1, cutlass::half_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 32, false, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4, true, 256, 32, true, 1, cutlass::bfloat16_t)
QMOE_CUTLASS_MIXED_INSTANCE(MixedCodes::kInt4Zero, true, 256, 32, false, 1, cutlass::bfloat16_t)

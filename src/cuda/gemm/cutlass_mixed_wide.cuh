// The wide tile of the mixed-input GEMM, 256 x 144 x 64, for calls whose experts average more
// than 128 rows and whose rows a 128-row tile leaves mostly padded: a group of r rows takes
// ceil(r / N) tiles of N rows, every tile converting the expert's weights again and running its
// wgmma over all N, so the tensor cores and the conversion see N ceil(r / N) rows for r real
// ones. Around a multiple of 128 rows per expert half of the groups spill a few rows into one
// more 128-row tile; 144 rows absorb the spread of a multinomial count there:
//
//   rows per expert (mean, sd)      128-row tiles: rows run        144-row tiles: rows run
//   256 +- 16 (qwen3 4096 tokens)   2.5 tiles  320 (80% real)      2.02 tiles  291 (88%)
//   128 +- 11 (DeepSeek 4096)       1.5 tiles  192 (67%)           1.08 tiles  155 (82%)
//
// (dispatch.h's mixed_tile_for weighs the two by the call's mean and spread.) Two m64 atoms per
// consumer warpgroup as the tall tile's, 144 accumulators a thread. N = 144 is one of CuTe's
// extended wgmma shapes (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED), which the unit that includes this
// header defines before any CUTLASS header (cutlass_mixed_wide.cu); the epilogue's subtile is 128 x
// 16 (gcd(32, 144), CUTLASS's cooperative rule).
#pragma once

#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#error \
    "cutlass_mixed_wide.cuh: define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED before any CUTLASS header"
#endif

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using WideTileShape = cute::Shape<cute::_256, cute::Int<144>, cute::_64>;
// The grouped GEMM's epilogues (column-major D, no C) on the wide tile: fp32 rows (f16 layers)
// and bf16 rows (bf16 layers; mixed_out_dtype).
using WideTileEpilogue = GroupEpilogueFor<WideTileShape>;
constexpr int kWideTileEpilogueSmem = static_cast<int>(sizeof(WideTileEpilogue::SharedStorage));
using WideTileEpilogueBf16 =
    GroupEpilogueFor<WideTileShape, GroupClusterShape, cutlass::bfloat16_t>;
constexpr int kWideTileEpilogueBf16Smem =
    static_cast<int>(sizeof(WideTileEpilogueBf16::SharedStorage));

template <>
struct MixedTile<256, 144> : MixedTileOf<WideTileShape, WideTileEpilogue, kWideTileEpilogueSmem,
                                         WideTileEpilogueBf16, kWideTileEpilogueBf16Smem> {};

}  // namespace qmoe::cuda::cutlass_detail

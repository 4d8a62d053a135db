// The narrow tile of the mixed-input GEMM, 128 x 32 x 64, for calls whose experts hold few rows
// (an average of at most 16 routes per expert: up to 256 tokens of a 128-expert top-8 layer). The
// 128-row tile pads a group of 8 rows to 128, so at 128 tokens 94% of every wgmma was padding and
// the kernel, not the weights' bytes, set the time; 32 rows keep the wgmma m64n32k16 busy on real
// rows while each weight tile is still read once per group. Included only by the translation
// units of the narrow instances (cutlass_mixed_*_n32.cu), so the others do not build its epilogue.
#pragma once

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using NarrowTileShape = cute::Shape<cute::_128, cute::_32, cute::_64>;
// The grouped GEMM's epilogue (fp32 column-major D, no C), on the narrow tile.
using NarrowEpilogue = GroupEpilogueFor<NarrowTileShape>;
constexpr int kNarrowEpilogueSmem = static_cast<int>(sizeof(NarrowEpilogue::SharedStorage));

template <>
struct MixedTile<32> {
  using Shape = NarrowTileShape;
  using Epilogue = NarrowEpilogue;
  static constexpr int kEpilogueSmem = kNarrowEpilogueSmem;
};

}  // namespace qmoe::cuda::cutlass_detail

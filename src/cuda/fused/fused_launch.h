// Internal to the fused decode kernel: what the launcher (fused_decode.cu) derives once per call
// and hands to the per-width instantiation files (fused_b2.cu, fused_b4.cu, fused_b8.cu).
#pragma once

#include <cstddef>

#include "cuda/fused/fused_decode.h"
#include "cuda/routing/device_routing.h"

namespace qmoe::cuda::fused_detail {

constexpr int kFusedWarps = 8;
constexpr int kFusedMaxRoutes = kFusedDecodeMaxTokens * kFusedMaxSlots;
// The widest slice: the activations of 16 routes stay small, and enough items remain.
constexpr int kFusedMaxUnits = 256;
// Work items a call aims for (independent of the device, so that a call's bits are too).
constexpr int kFusedTargetItems = 256;

// Byte offsets into the dynamic shared memory and the strides (fused_decode_kernel.cuh draws it).
struct FusedGeometry {
  int units = 0, slices = 0;
  int ld1 = 0, lda = 0, zrow_len = 0;
  int nbp1 = 1, cpb1 = 1;  // FC1: scale blocks per row (whole K), chunks per block
  int nbs2 = 1, cpb2 = 1;  // FC2: scale blocks per row of a slice, chunks per block
  int off_xs = 0, off_zrow = 0, off_acts = 0, off_sc1 = 0, off_zs1 = 0, off_sc2 = 0, off_zs2 = 0;
  size_t smem = 0;
  int spb = 0;  // steps per scale block when blocks are shorter than a chunk, else 0
};

// The kernel of a width, activation type and kSpb, or nullptr where none is compiled.
template <int kBits>
const void* fused_kernel_for(bool bf16, int spb);

}  // namespace qmoe::cuda::fused_detail

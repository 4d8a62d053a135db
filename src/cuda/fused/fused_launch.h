// Internal to the fused decode kernel: the constants the launcher (fused_decode.cu) and the kernel
// share, and the per-width instantiation files' entry (fused_b2.cu, fused_b4.cu, fused_b8.cu).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/common/sm90.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/routing/device_routing.h"

namespace qmoe::cuda::fused_detail {

constexpr int kFusedWarps = 8;
constexpr int kFusedMaxRoutes = kFusedDecodeMaxTokens * kFusedMaxSlots;
// Work items of each FC a call aims for (independent of the device, so that a call's bits are
// too): at one token of Qwen3-30B-A3B, FC1 takes 2 K parts of 4 tiles (192 items), FC2 whole tiles (128),
// one round on the H200's 264 CTAs. 256 and 512 (more K parts, two rounds of FC1) measured 6-10%
// and 23-26% slower at 1 and 2 tokens (bench/results/2026-12-03-h200-fused-items.md).
constexpr int kFusedTargetItems = 128;
// Two CTAs per multiprocessor: the dynamic shared memory each may use. Each also has its static
// routing maps (11280 bytes; fused_prologue.cuh asserts that two CTAs fit) and the reserved
// share, which leaves 104432 bytes of the multiprocessor's 228 KiB each.
constexpr size_t kFusedSmemBudget = 100 * 1024;
// A warp's weight ring (fused_decode_kernel.cuh's WarpRing): slots of one 512-byte chunk (16 bytes
// per lane), as many as the shared-memory budget leaves after the staging, within these bounds:
// 16 slots of 8 warps and two CTAs per SM keep 128 KiB of weights in flight per multiprocessor
// (one-token calls: a warp's whole part of its item); 16 tokens of a 2048-wide layer stage 66 KiB
// of input rows and leave 3.
constexpr uint32_t kChunkBytes = 512;
constexpr uint32_t kBarrierBytes = 8;  // a slot's shared-memory barrier (bulk_copy.cuh)
constexpr int kRingMinSlots = 2;
constexpr int kRingMaxSlots = 16;

// The kernel of a width, activation type and kSpb, or nullptr where none is compiled.
template <int kBits>
const void* fused_kernel_for(bool bf16, int spb);

}  // namespace qmoe::cuda::fused_detail

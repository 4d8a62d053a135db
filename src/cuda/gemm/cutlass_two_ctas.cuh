// Two CTAs per SM of CUTLASS's SM90 warp-specialized grouped GEMM, for the translation unit that
// includes this header before any CUTLASS header (cutlass_mixed_narrow.cu, the narrow tile).
//
// CUTLASS's cooperative kernel is laid out for one CTA per SM: three warpgroups launched at 168
// registers a thread, then the producer warpgroup gives registers back (setmaxnreg.dec 40) and
// the two consumer warpgroups take them (setmaxnreg.inc 232), both counts constants of the
// kernel. The narrow tile's consumers are bound by their conversion chain's latency with two
// warps per scheduler (docs/cuda-backend.md), and need far fewer registers than 232 (32
// accumulators a thread), so a second CTA on the SM doubles the warps that hide that latency:
//
//   registers of one SM                      65536
//   per thread at launch, 2 x 384 threads    65536 / 768 = 85, allocated in 8s: 80
//   per CTA                                  384 x 80 = 30720
//   producer warpgroup after the dec         128 x 40 = 5120
//   consumers: the CTA's rest / 256 threads  (30720 - 5120) / 256 = 100, in 8s: 96
//
// A CTA's setmaxnreg.inc can only take what its producer released; asking for 232 at 80 would
// wait forever. So in this unit the two register-reconfiguration functions are specialized for
// exactly CUTLASS's two counts and ask for 40 and 96 instead; kCutlassMainloopRegs and
// kCutlassLoadRegs name the counts, and MixedGemm (MixedFitsTwoCtas) checks at compile time that
// the kernel still asks for 232 and 40 (a CUTLASS with other counts fails to build rather than
// hang). ptxas then allocates the consumers' code within 96 registers: the narrow tile's k-block
// loop compiles to the same instructions as at 232 (no spills, no serialized wgmma;
// bench/results/2026-12-05-sass-narrow-two-ctas.md).
//
// The specializations are inline device functions of this unit's own device code (the library
// links no device code across units: no relocatable device code), so the other units keep
// CUTLASS's counts.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include <cstdint>

#include "cuda/common/sm90.h"

#define QMOE_CUTLASS_TWO_CTAS_PER_SM 1

namespace qmoe::cuda::cutlass_detail {

constexpr uint32_t kCutlassLoadRegs = 40;       // CUTLASS's LoadRegisterRequirement
constexpr uint32_t kCutlassMainloopRegs = 232;  // CUTLASS's MmaRegisterRequirement
constexpr int kTwoCtasThreads = 384;            // three warpgroups
// Registers a thread at launch for two CTAs per SM, and what the consumers grow to.
constexpr uint32_t kTwoCtasLaunchRegs =
    static_cast<uint32_t>(kSm90RegsPerSm / (2 * kTwoCtasThreads)) / 8 * 8;
constexpr uint32_t kTwoCtasMainloopRegs =
    (kTwoCtasLaunchRegs * kTwoCtasThreads - kCutlassLoadRegs * 128) / 256 / 8 * 8;
static_assert(kTwoCtasLaunchRegs == 80 && kTwoCtasMainloopRegs == 96, "the table above");

}  // namespace qmoe::cuda::cutlass_detail

namespace cutlass::arch {

template <>
CUTLASS_DEVICE void warpgroup_reg_alloc<qmoe::cuda::cutlass_detail::kCutlassMainloopRegs>() {
#if defined(__CUDA_ARCH__)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n"
               :
               : "n"(qmoe::cuda::cutlass_detail::kTwoCtasMainloopRegs));
#endif
}

template <>
CUTLASS_DEVICE void warpgroup_reg_dealloc<qmoe::cuda::cutlass_detail::kCutlassLoadRegs>() {
#if defined(__CUDA_ARCH__)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n"
               :
               : "n"(qmoe::cuda::cutlass_detail::kCutlassLoadRegs));
#endif
}

}  // namespace cutlass::arch

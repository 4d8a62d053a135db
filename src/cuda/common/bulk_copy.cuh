// Bulk asynchronous copies global -> shared memory (Hopper's cp.async.bulk, the copy engine
// without a tensor map) and the shared-memory barriers that count their bytes.
//
// A barrier is 8 bytes of shared memory. The thread that issues a copy first announces its bytes
// (arrive_expect_tx: one arrival plus the transaction count); the copy engine counts them down as
// they land, and the barrier's phase flips once both are complete. A reader waits for the phase
// it expects (0, 1, 0, ... for the 1st, 2nd, 3rd use of the barrier), then reads the bytes with
// ordinary loads. Addresses are 32-bit shared-memory addresses (decode_common.cuh's smem_u32);
// copies move multiples of 16 bytes between 16-byte aligned addresses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace qmoe::cuda {

// A barrier that completes a phase after one arrival (and its announced bytes).
__device__ __forceinline__ void mbarrier_init1(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
}

// Makes barriers initialized by this thread visible to the copy engine (and other threads).
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` still to land on the barrier.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Waits until the barrier's phase with parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  } while (done == 0);
}

// `bytes` from global src to shared dst, counted on barrier bar.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

}  // namespace qmoe::cuda

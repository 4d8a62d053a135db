// The decode chain's timeline, a measurement build only (cmake -DQMOE_STAMPS=ON; never set in a
// normal build, where the macros below are empty). Per call, each instrumented kernel records in
// %globaltimer nanoseconds when its first block entered, when its first and last blocks were past
// their programmatic-dependent-launch wait, and when its last block ended:
//
//   kernel slot s, call c (its launches counted by the kernel's last block):
//     table.rec[s][c % kStampCalls] = { entry first, waited first, waited last, end last }
//
// so that a graph replay, where the kernels overlap through PDL, shows where its time goes (the
// CUDA events of an eager call serialize the kernels). No relocatable device code: each
// translation unit that includes this header has its own table, which its host function
// (QMOE_STAMPS_EXPORT) reads and resets; stamps.h gathers them.
#pragma once

namespace qmoe::cuda {

// The device's %globaltimer, ns (every build: the fused decode kernel's RunProfile reads it too).
__device__ __forceinline__ unsigned long long globaltimer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace qmoe::cuda

#if defined(QMOE_STAMPS)

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/common/stamps.h"

namespace qmoe::cuda::stamps {

constexpr int kStampCalls = 512;
constexpr int kStampSlots = 2;

struct StampTable {
  unsigned long long rec[kStampSlots][kStampCalls][kStampFields];
  unsigned int call[kStampSlots];
  unsigned int done[kStampSlots];
};

// This translation unit's table (internal linkage: one per unit).
static __device__ StampTable g_stamp_table;

__device__ __forceinline__ unsigned long long stamp_now() { return globaltimer_ns(); }

// The record of this call of slot s (thread 0 of each block reads it once, at entry).
__device__ __forceinline__ unsigned long long* stamp_record(int s) {
  const unsigned int c = *reinterpret_cast<volatile unsigned int*>(&g_stamp_table.call[s]);
  return g_stamp_table.rec[s][c % kStampCalls];
}

// At block end (every thread of the block past its work): the end, and the last block of the
// grid moves the slot to the next call.
__device__ __forceinline__ void stamp_end(unsigned long long* r, int s) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  atomicMax(r + kEndLast, stamp_now());
  __threadfence();
  const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
  if (atomicAdd(&g_stamp_table.done[s], 1u) == blocks - 1) {
    g_stamp_table.done[s] = 0;
    __threadfence();
    atomicAdd(&g_stamp_table.call[s], 1u);
  }
}

// Host: slot s's records of the calls since the last take (at most kStampCalls, oldest first),
// then every slot reset. Returns false on a CUDA error.
inline bool take_table(const void* symbol, std::vector<std::vector<unsigned long long>>* out) {
  static StampTable host;
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  if (cudaMemcpyFromSymbol(&host, symbol, sizeof(StampTable)) != cudaSuccess) return false;
  out->assign(kStampSlots, {});
  for (int s = 0; s < kStampSlots; ++s) {
    const unsigned int n = host.call[s] < kStampCalls ? host.call[s] : kStampCalls;
    for (unsigned int i = 0; i < n; ++i) {
      const unsigned int c = host.call[s] - n + i;
      for (int f = 0; f < kStampFields; ++f) (*out)[s].push_back(host.rec[s][c % kStampCalls][f]);
    }
  }
  for (int s = 0; s < kStampSlots; ++s) {
    for (int c = 0; c < kStampCalls; ++c) {
      host.rec[s][c][kEntryFirst] = host.rec[s][c][kWaitedFirst] = ~0ull;
      host.rec[s][c][kWaitedLast] = host.rec[s][c][kEndLast] = 0ull;
    }
    host.call[s] = host.done[s] = 0;
  }
  return cudaMemcpyToSymbol(symbol, &host, sizeof(StampTable)) == cudaSuccess;
}

// Entry and end of a block: constructed first in a kernel, its destructor runs at every return.
// The end waits for all the block's threads at one barrier, so an instrumented kernel's threads
// must leave it together (the decode kernel's blocks return as a whole; the finalize kernel has
// one exit).
struct StampScope {
  int s;
  __device__ explicit StampScope(int slot) : s(slot) {
    if (threadIdx.x == 0) atomicMin(stamp_record(s) + kEntryFirst, stamp_now());
  }
  __device__ ~StampScope() { stamp_end(stamp_record(s), s); }
};

}  // namespace qmoe::cuda::stamps

// In a kernel: QMOE_STAMP_SCOPE(s) first, QMOE_STAMP_WAITED(s) after its PDL wait. The slot's call
// index moves only when the grid's last block has ended, so every block of a launch finds the
// same record.
#define QMOE_STAMP_SCOPE(s) ::qmoe::cuda::stamps::StampScope qmoe_stamp_scope(s)
#define QMOE_STAMP_WAITED(s)                                             \
  if (threadIdx.x == 0) {                                                \
    unsigned long long* qmoe_r = ::qmoe::cuda::stamps::stamp_record(s);  \
    const unsigned long long qmoe_t = ::qmoe::cuda::stamps::stamp_now(); \
    atomicMin(qmoe_r + ::qmoe::cuda::stamps::kWaitedFirst, qmoe_t);      \
    atomicMax(qmoe_r + ::qmoe::cuda::stamps::kWaitedLast, qmoe_t);       \
  }
// A translation unit's reader: bool NAME(std::vector<std::vector<unsigned long long>>*).
#define QMOE_STAMPS_EXPORT(NAME)                                                        \
  bool NAME(std::vector<std::vector<unsigned long long>>* out) {                        \
    return ::qmoe::cuda::stamps::take_table(&::qmoe::cuda::stamps::g_stamp_table, out); \
  }

#else

#define QMOE_STAMP_SCOPE(s)
#define QMOE_STAMP_WAITED(s)

#endif

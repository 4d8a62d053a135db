// What the kernels size themselves by on sm_90 (H100, H200), in one place. The library refuses
// other devices at prepare (docs/cuda-backend.md), so these are facts, not device queries; the
// launchers still ask the occupancy API where a kernel's residency must be exact (the fused
// kernel's cooperative grid).
#pragma once

#include <cstddef>

namespace qmoe::cuda {

constexpr size_t kSm90SmemPerSm = 228 * 1024;           // shared memory of one multiprocessor
constexpr size_t kSm90SmemPerBlockOptin = 227 * 1024;   // the most one block may opt into
constexpr size_t kSm90SmemReservedPerBlock = 1024;      // the system's share of each resident block
constexpr size_t kSm90SmemDefaultPerBlock = 48 * 1024;  // without the opt-in attribute
constexpr int kSm90RegsPerSm = 64 * 1024;               // 32-bit registers of one multiprocessor

}  // namespace qmoe::cuda

// The int4 codes' shuffle into the mixed-input GEMM's order (cutlass_mixed_shuffle.cuh), on the
// device at prepare, and the host twin the tests compare it with.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/gemm/cutlass_mixed_shuffle.cuh"

namespace qmoe::cuda {
namespace {

using cutlass_detail::kShuffleCols;
using cutlass_detail::kShuffleRows;
using cutlass_detail::kShuffleSize;

// The atom inverted: the (row, column) within the atom of each offset.
struct AtomInverse {
  uint8_t row[kShuffleSize];
  uint8_t col[kShuffleSize];
};

AtomInverse atom_inverse() {
  AtomInverse inv{};
  const cutlass_detail::ShuffleAtom atom{};
  for (int r = 0; r < kShuffleRows; ++r) {
    for (int c = 0; c < kShuffleCols; ++c) {
      const int o = static_cast<int>(atom(r, c));
      inv.row[o] = static_cast<uint8_t>(r);
      inv.col[o] = static_cast<uint8_t>(c);
    }
  }
  return inv;
}

// One thread per output byte: its two codes (offsets 2d and 2d + 1 of the expert) gathered from
// the K-contiguous input, so no two threads write one byte.
__global__ void shuffle_kernel(const uint8_t* in, uint8_t* out, int64_t bytes, int64_t n,
                               int64_t k, const AtomInverse inv) {
  const int64_t per_expert = n * k / 2;
  const int64_t tiles_n = n / kShuffleRows;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < bytes;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = g / per_expert;
    const int64_t o = 2 * (g % per_expert);
    const int64_t tile = o / kShuffleSize;
    const int r = static_cast<int>(o % kShuffleSize);
    const int64_t m0 = (tile % tiles_n) * kShuffleRows, k0 = (tile / tiles_n) * kShuffleCols;
    const uint8_t* src = in + e * per_expert;
    uint8_t b = 0;
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + inv.row[r + h], kk = k0 + inv.col[r + h];
      const int q = (src[(m * k + kk) / 2] >> (4 * (kk & 1))) & 15;
      b |= static_cast<uint8_t>(q << (4 * h));
    }
    out[g] = b;
  }
}

}  // namespace

Status mixed_shuffle_codes(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n, int64_t k,
                           cudaStream_t stream) {
  if (n <= 0 || k <= 0 || n % kMixedShuffleRows != 0 || k % kMixedShuffleCols != 0 ||
      experts <= 0) {
    return Status::invalid("mixed_shuffle_codes: expected experts > 0, n a multiple of " +
                           std::to_string(kMixedShuffleRows) + " and k of " +
                           std::to_string(kMixedShuffleCols) + ", got " +
                           std::to_string(experts) + ", " + std::to_string(n) + ", " +
                           std::to_string(k));
  }
  if (in == out) return Status::invalid("mixed_shuffle_codes: in and out must not overlap");
  const int64_t bytes = experts * n * k / 2;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((bytes + threads - 1) / threads, 1 << 20);
  shuffle_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(in, out, bytes, n, k,
                                                                        atom_inverse());
  QMOE_CUDA_CHECK_LAUNCH("mixed_shuffle_codes");
  return Status::ok();
}

void mixed_shuffle_codes_host(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n,
                              int64_t k) {
  // The whole layout as CuTe tiles it, element by element: independent of the kernel's
  // decomposition into atoms.
  const auto layout = cutlass_detail::shuffled_layout(static_cast<int>(n), static_cast<int>(k));
  const int64_t per_expert = n * k / 2;
  for (int64_t e = 0; e < experts; ++e) {
    const uint8_t* src = in + e * per_expert;
    uint8_t* dst = out + e * per_expert;
    for (int64_t i = 0; i < per_expert; ++i) dst[i] = 0;
    for (int64_t m = 0; m < n; ++m) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const int q = (src[(m * k + kk) / 2] >> (4 * (kk & 1))) & 15;
        const int64_t o = layout(static_cast<int>(m), static_cast<int>(kk), 0);
        dst[o / 2] = static_cast<uint8_t>(dst[o / 2] | (q << (4 * (o & 1))));
      }
    }
  }
}

}  // namespace qmoe::cuda

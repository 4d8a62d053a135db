// The int4 codes' shuffle into the mixed-input GEMM's order (cutlass_mixed_shuffle.cuh), on the
// device at prepare, and the host twin the tests compare it with.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/gemm/cutlass_mixed_shuffle.cuh"

namespace qmoe::cuda {
namespace {

using cutlass_detail::kShuffleCols;
using cutlass_detail::kShuffleRows;
static_assert(cutlass_detail::kShuffleSize == 32 * 8, "a warp's 32 words of eight codes");
static_assert(kShuffleRows == kMixedShuffleRows && kShuffleCols == kMixedShuffleCols,
              "cutlass_mixed.h's shape rule is the atom's");

// One warp per atom, one 32-bit output word per lane: lane t's eight codes (the drawn order)
// come from four bytes, rows r = t / 4 and r + 8 at k0 = 2 (t % 4) and k0 + 8, each byte holding
// the codes of two adjacent k. A block's warps take consecutive atoms along k of one 16-row band,
// so its loads cover whole 64-byte row segments. `flip` XORs every nibble with 8 on the way (ORT's
// unsigned codes to the signed copy, cutlass_mixed.h's q - 8).
constexpr int kAtomsPerBlock = 8;

__global__ void shuffle_kernel(const uint8_t* in, uint32_t* out, int64_t n, int64_t k,
                               int64_t bands, bool flip) {
  const int64_t atoms_k = k / kShuffleCols;
  const int64_t groups_k = (atoms_k + kAtomsPerBlock - 1) / kAtomsPerBlock;
  const int lane = threadIdx.x % 32;
  const int64_t tk = (blockIdx.x % groups_k) * kAtomsPerBlock + threadIdx.x / 32;
  const int64_t band = blockIdx.x / groups_k;  // over experts x n / 16
  if (band >= bands || tk >= atoms_k) return;
  const int64_t bands_e = n / kShuffleRows;
  const int64_t e = band / bands_e, tm = band % bands_e;
  const int64_t r = tm * kShuffleRows + lane / 4, k0 = tk * kShuffleCols + 2 * (lane % 4);
  const uint8_t* src = in + e * n * k / 2;
  // Byte (row, k) holds codes k (low) and k + 1 (high): v0 v1 | v4 v5 at row r, v2 v3 | v6 v7
  // at row r + 8.
  const uint32_t b0 = src[(r * k + k0) / 2], b4 = src[(r * k + k0 + 8) / 2];
  const uint32_t b2 = src[((r + 8) * k + k0) / 2], b6 = src[((r + 8) * k + k0 + 8) / 2];
  const uint32_t v[8] = {b0 & 15, b0 >> 4, b2 & 15, b2 >> 4, b4 & 15, b4 >> 4, b6 & 15, b6 >> 4};
  // Nibble p of the word holds v[2p] for p < 4 and v[2 (p - 4) + 1] after: 0 2 4 6 1 3 5 7.
  uint32_t w = 0;
  for (int p = 0; p < 8; ++p) w |= v[p < 4 ? 2 * p : 2 * (p - 4) + 1] << (4 * p);
  if (flip) w ^= 0x88888888u;
  // The atom (tm, tk) of expert e: atoms column-major over [n / 16, k / 16], 32 words each.
  const int64_t atom = e * bands_e * atoms_k + tm + bands_e * tk;
  out[atom * 32 + lane] = w;
}

}  // namespace

Status mixed_shuffle_codes(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n, int64_t k,
                           bool flip, cudaStream_t stream) {
  if (n <= 0 || k <= 0 || n % kMixedShuffleRows != 0 || k % kMixedShuffleCols != 0 ||
      experts <= 0) {
    return Status::invalid("mixed_shuffle_codes: expected experts > 0, n a multiple of " +
                           std::to_string(kMixedShuffleRows) + " and k of " +
                           std::to_string(kMixedShuffleCols) + ", got " + std::to_string(experts) +
                           ", " + std::to_string(n) + ", " + std::to_string(k));
  }
  if (in == out) return Status::invalid("mixed_shuffle_codes: in and out must not overlap");
  if (reinterpret_cast<uintptr_t>(out) % 4 != 0) {
    return Status::invalid("mixed_shuffle_codes: out: expected a 4-byte aligned pointer");
  }
  const int64_t bands = experts * (n / kShuffleRows);
  const int64_t groups_k = (k / kShuffleCols + kAtomsPerBlock - 1) / kAtomsPerBlock;
  const int64_t blocks = bands * groups_k;
  if (blocks > INT32_MAX) return Status::invalid("mixed_shuffle_codes: tensor too large");
  shuffle_kernel<<<static_cast<unsigned>(blocks), 32 * kAtomsPerBlock, 0, stream>>>(
      in, reinterpret_cast<uint32_t*>(out), n, k, bands, flip);
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

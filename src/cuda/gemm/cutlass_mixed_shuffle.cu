// The int4 and int8 codes' shuffle into the mixed-input GEMM's order (cutlass_mixed_shuffle.cuh),
// on the device at prepare, and the host twin the tests compare it with.
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
static_assert(cutlass_detail::kShuffleSize == 32 * 8, "a warp's 32 lanes of eight codes");
static_assert(kShuffleRows == kMixedShuffleRows && kShuffleCols == kMixedShuffleCols,
              "cutlass_mixed.h's shape rule is the atom's");

// One warp per atom, one lane's eight codes per lane (the drawn order): rows r = t / 4 and r + 8
// at k0 = 2 (t % 4) and k0 + 8, two adjacent k from each. A block's warps take consecutive atoms
// along k of one 16-row band, so its loads cover whole row segments. `flip` flips each code's top
// bit on the way (ORT's unsigned codes to cutlass_mixed.h's signed copy, q - 8 or q - 128).
constexpr int kAtomsPerBlock = 8;

struct AtomAt {
  int64_t e, r, k0, atom;  // expert, the lane's first row and k, the atom's index
  bool live;               // inside the tensor (the last block along k may run past it)
};

__device__ AtomAt atom_at(int64_t n, int64_t k, int64_t bands) {
  const int64_t atoms_k = k / kShuffleCols;
  const int64_t groups_k = (atoms_k + kAtomsPerBlock - 1) / kAtomsPerBlock;
  const int lane = threadIdx.x % 32;
  const int64_t tk = (blockIdx.x % groups_k) * kAtomsPerBlock + threadIdx.x / 32;
  const int64_t band = blockIdx.x / groups_k;  // over experts x n / 16
  const int64_t bands_e = n / kShuffleRows;
  AtomAt a;
  a.e = band / bands_e;
  const int64_t tm = band % bands_e;
  a.r = tm * kShuffleRows + lane / 4;
  a.k0 = tk * kShuffleCols + 2 * (lane % 4);
  a.live = band < bands && tk < atoms_k;
  // Atoms along k first over [n / 16, k / 16] per expert (a band's atoms in a row).
  a.atom = (a.e * bands_e + tm) * atoms_k + tk;
  return a;
}

// The rows a lane reads: its rows r and r + 8 of the shuffled copy come from these source rows.
struct RowOrder {
  GluRows glu;
  int64_t inter;
  __device__ int64_t operator()(int64_t r) const { return glu_source_row(glu, inter, r); }
};

__global__ void shuffle4_kernel(const uint8_t* in, uint32_t* out, int64_t n, int64_t k,
                                int64_t bands, bool flip, RowOrder rows) {
  const AtomAt a = atom_at(n, k, bands);
  if (!a.live) return;
  const int64_t r = rows(a.r), r8 = rows(a.r + 8), k0 = a.k0;
  const uint8_t* src = in + a.e * n * k / 2;
  // Byte (row, k) holds codes k (low) and k + 1 (high): v0 v1 | v4 v5 at row r, v2 v3 | v6 v7
  // at row r + 8.
  const uint32_t b0 = src[(r * k + k0) / 2], b4 = src[(r * k + k0 + 8) / 2];
  const uint32_t b2 = src[(r8 * k + k0) / 2], b6 = src[(r8 * k + k0 + 8) / 2];
  const uint32_t v[8] = {b0 & 15, b0 >> 4, b2 & 15, b2 >> 4, b4 & 15, b4 >> 4, b6 & 15, b6 >> 4};
  // Nibble p of the word holds v[2p] for p < 4 and v[2 (p - 4) + 1] after: 0 2 4 6 1 3 5 7.
  uint32_t w = 0;
  for (int p = 0; p < 8; ++p) w |= v[p < 4 ? 2 * p : 2 * (p - 4) + 1] << (4 * p);
  if (flip) w ^= 0x88888888u;
  out[a.atom * 32 + threadIdx.x % 32] = w;
}

__global__ void shuffle8_kernel(const uint8_t* in, uint2* out, int64_t n, int64_t k, int64_t bands,
                                bool flip, RowOrder rows) {
  const AtomAt a = atom_at(n, k, bands);
  if (!a.live) return;
  const uint8_t* src = in + a.e * n * k;
  const uint8_t* row0 = src + rows(a.r) * k + a.k0;      // v0 v1 at +0, v4 v5 at +8
  const uint8_t* row8 = src + rows(a.r + 8) * k + a.k0;  // v2 v3 at +0, v6 v7 at +8
  // Byte p of each word: 0 2 1 3, i.e. v0 v2 v1 v3 | v4 v6 v5 v7.
  auto word = [](uint32_t v0, uint32_t v1, uint32_t v2, uint32_t v3) {
    return v0 | (v2 << 8) | (v1 << 16) | (v3 << 24);
  };
  uint2 w = make_uint2(word(row0[0], row0[1], row8[0], row8[1]),
                       word(row0[8], row0[9], row8[8], row8[9]));
  if (flip) w.x ^= 0x80808080u, w.y ^= 0x80808080u;
  out[a.atom * 32 + threadIdx.x % 32] = w;
}

}  // namespace

Status mixed_shuffle_codes(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n, int64_t k,
                           int bits, bool flip, cudaStream_t stream, GluRows glu, int64_t inter) {
  if (bits != 4 && bits != 8) {
    return Status::invalid("mixed_shuffle_codes: bits: expected 4 or 8, got " +
                           std::to_string(bits));
  }
  if (n <= 0 || k <= 0 || n % kMixedShuffleRows != 0 || k % kMixedShuffleCols != 0 ||
      experts <= 0) {
    return Status::invalid("mixed_shuffle_codes: expected experts > 0, n a multiple of " +
                           std::to_string(kMixedShuffleRows) + " and k of " +
                           std::to_string(kMixedShuffleCols) + ", got " + std::to_string(experts) +
                           ", " + std::to_string(n) + ", " + std::to_string(k));
  }
  std::string why;
  if (!glu_rows_fit(glu, n, inter, &why)) return Status::invalid("mixed_shuffle_codes: " + why);
  if (in == out) return Status::invalid("mixed_shuffle_codes: in and out must not overlap");
  if (reinterpret_cast<uintptr_t>(out) % 8 != 0) {
    return Status::invalid("mixed_shuffle_codes: out: expected an 8-byte aligned pointer");
  }
  const int64_t bands = experts * (n / kShuffleRows);
  const int64_t groups_k = (k / kShuffleCols + kAtomsPerBlock - 1) / kAtomsPerBlock;
  const int64_t blocks = bands * groups_k;
  if (blocks > INT32_MAX) return Status::invalid("mixed_shuffle_codes: tensor too large");
  if (bits == 4) {
    shuffle4_kernel<<<static_cast<unsigned>(blocks), 32 * kAtomsPerBlock, 0, stream>>>(
        in, reinterpret_cast<uint32_t*>(out), n, k, bands, flip, RowOrder{glu, inter});
  } else {
    shuffle8_kernel<<<static_cast<unsigned>(blocks), 32 * kAtomsPerBlock, 0, stream>>>(
        in, reinterpret_cast<uint2*>(out), n, k, bands, flip, RowOrder{glu, inter});
  }
  QMOE_CUDA_CHECK_LAUNCH("mixed_shuffle_codes");
  return Status::ok();
}

namespace {

template <int kBits>
void shuffle_host(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n, int64_t k) {
  // The whole layout as CuTe tiles it, element by element: independent of the kernel's
  // decomposition into atoms.
  const auto layout =
      cutlass_detail::shuffled_layout<kBits>(static_cast<int>(n), static_cast<int>(k));
  const int64_t per_expert = n * k * kBits / 8;
  for (int64_t e = 0; e < experts; ++e) {
    const uint8_t* src = in + e * per_expert;
    uint8_t* dst = out + e * per_expert;
    for (int64_t i = 0; i < per_expert; ++i) dst[i] = 0;
    for (int64_t m = 0; m < n; ++m) {
      for (int64_t kk = 0; kk < k; ++kk) {
        const int64_t o = layout(static_cast<int>(m), static_cast<int>(kk), 0);
        if constexpr (kBits == 8) {
          dst[o] = src[m * k + kk];
        } else {
          const int q = (src[(m * k + kk) / 2] >> (4 * (kk & 1))) & 15;
          dst[o / 2] = static_cast<uint8_t>(dst[o / 2] | (q << (4 * (o & 1))));
        }
      }
    }
  }
}

}  // namespace

void mixed_shuffle_codes_host(const uint8_t* in, uint8_t* out, int64_t experts, int64_t n,
                              int64_t k, int bits) {
  if (bits == 8) {
    shuffle_host<8>(in, out, experts, n, k);
  } else {
    shuffle_host<4>(in, out, experts, n, k);
  }
}

}  // namespace qmoe::cuda

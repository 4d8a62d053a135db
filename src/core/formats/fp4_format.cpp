// FP4 formats. Layout (per expert):
//   weight  K-packed [N, K/2]: byte (n, j) holds k = 2j (low nibble) and k = 2j + 1 (high);
//           N-packed [K, N/2]: byte (k, j) holds n = 2j (low nibble) and n = 2j + 1 (high)
//   scales  [N, K/block]  nvfp4: e4m3, block 16; mxfp4: e8m0 (2^(c-127)), block 32
//   global  fp32 scalar
#include "core/formats/fp4_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/formats/codec.h"

namespace qmoe {
namespace formats {

namespace {

// Dequantizes kGroup K-packed codes (kGroup / kBlock blocks): decode into a local array, apply
// the block scales, then the global scale. (code * s) is exact in fp32 (a 2-bit significand times
// an e4m3 or power-of-two scale), so the product with g is the only rounding. This shape (short
// fixed-length loops over a local array) is what g++ vectorizes best: a fused loop per block, or
// decoding a whole row and then scaling it in place, run 2-4x slower.
template <typename T, int kBlock, int kGroup, DType kScale>
inline void fp4_group(const uint8_t* codes, const uint8_t* scales, T g, T* out) {
  T t[kGroup];
  for (int j = 0; j < kGroup / 2; ++j) {
    const float* pair = kE2m1Pairs.v[codes[j]];
    if constexpr (std::is_same<T, float>::value) {
      std::memcpy(t + 2 * j, pair, 2 * sizeof(float));  // one 8-byte move
    } else {
      t[2 * j] = static_cast<T>(pair[0]);
      t[2 * j + 1] = static_cast<T>(pair[1]);
    }
  }
  for (int b = 0; b < kGroup / kBlock; ++b) {
    const T s = static_cast<T>(load_scale<kScale>(scales, b));
    for (int i = 0; i < kBlock; ++i) t[b * kBlock + i] *= s;
  }
  for (int i = 0; i < kGroup; ++i) out[i] = t[i] * g;
}

// Groups of 64 codes measured fastest for 16-code blocks (nvfp4), single blocks for 32 (mxfp4).
template <int kBlock>
constexpr int kFp4Group = kBlock == 16 ? 64 : kBlock;

// One row of k K-packed codes and its k / kBlock scales.
template <typename T, int kBlock, DType kScale>
void fp4_row_k_packed(const uint8_t* codes, const uint8_t* scales, int64_t k, T g, T* out) {
  constexpr int kGroup = kFp4Group<kBlock>;
  const int64_t groups = k / kGroup;
  for (int64_t i = 0; i < groups; ++i) {
    fp4_group<T, kBlock, kGroup, kScale>(codes + i * (kGroup / 2), scales + i * (kGroup / kBlock),
                                         g, out + i * kGroup);
  }
  for (int64_t b = groups * (kGroup / kBlock); b < k / kBlock; ++b) {
    fp4_group<T, kBlock, kBlock, kScale>(codes + b * (kBlock / 2), scales + b, g, out + b * kBlock);
  }
}

// N-packed rows are strided (one nibble per K row): gather them into K-packed order a bounded
// chunk at a time, then dequantize the chunk as above.
template <typename T, int kBlock, DType kScale>
void fp4_row_n_packed(const uint8_t* codes, int64_t stride, int shift, const uint8_t* scales,
                      int64_t k, T g, T* out) {
  constexpr int64_t kChunk = 256;
  static_assert(kChunk % kBlock == 0, "chunks hold whole blocks");
  uint8_t tmp[kChunk / 2];
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t len = k - k0 < kChunk ? k - k0 : kChunk;  // a multiple of kBlock
    const uint8_t* src = codes + k0 * stride;
    for (int64_t j = 0; j < len / 2; ++j) {
      const unsigned lo = (src[(2 * j) * stride] >> shift) & 15u;
      const unsigned hi = (src[(2 * j + 1) * stride] >> shift) & 15u;
      tmp[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
    fp4_row_k_packed<T, kBlock, kScale>(tmp, scales + k0 / kBlock, len, g, out + k0);
  }
}

template <typename T, int kBlock, DType kScale>
void fp4_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e, int64_t row,
             T* out) {
  const uint8_t* weight = static_cast<const uint8_t*>(w.weight.data);
  const uint8_t* scales = static_cast<const uint8_t*>(w.scales.data) + (e * n + row) * (k / kBlock);
  const T g = static_cast<T>(static_cast<const float*>(w.global_scale.data)[e]);
  if (f.fp4_layout == Fp4Layout::kKPacked) {
    fp4_row_k_packed<T, kBlock, kScale>(weight + (e * n + row) * (k / 2), scales, k, g, out);
  } else {
    const int64_t stride = n / 2;
    fp4_row_n_packed<T, kBlock, kScale>(weight + e * k * stride + row / 2, stride,
                                        static_cast<int>(row & 1) * 4, scales, k, g, out);
  }
}

// The quantizers write one expert's scales, global scale and K-packed codes (into dst [n, k/2],
// zeroed).
void quantize_nvfp4(const float* w, int64_t n, int64_t k, float* global, uint8_t* scales,
                    uint8_t* dst) {
  constexpr int kBlock = 16;
  float amax = 0.0f;
  for (int64_t i = 0; i < n * k; ++i) amax = std::max(amax, std::fabs(w[i]));
  // g = amax / (6 * 448) puts the largest block scale at e4m3's maximum. An all-zero expert keeps
  // g = 1 (its block scales and codes are then all zero).
  float g = amax / (6.0f * 448.0f);
  if (!(g > 0.0f)) g = 1.0f;
  *global = g;
  const int64_t blocks = k / kBlock;
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* x = w + row * k + b * kBlock;
      float bmax = 0.0f;
      for (int i = 0; i < kBlock; ++i) bmax = std::max(bmax, std::fabs(x[i]));
      const uint8_t sc = num::f32_to_e4m3(bmax / 6.0f / g);
      scales[row * blocks + b] = sc;
      const float denom = num::e4m3_to_f32(sc) * g;  // the stored scale
      uint8_t* p = dst + row * (k / 2) + b * (kBlock / 2);
      for (int i = 0; i < kBlock; ++i) {
        const uint8_t c = denom > 0.0f ? num::f32_to_e2m1(x[i] / denom) : 0;
        p[i / 2] = static_cast<uint8_t>(p[i / 2] | (c << (4 * (i & 1))));
      }
    }
  }
}

void quantize_mxfp4(const float* w, int64_t n, int64_t k, float* global, uint8_t* scales,
                    uint8_t* dst) {
  constexpr int kBlock = 32;
  *global = 1.0f;
  const int64_t blocks = k / kBlock;
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* x = w + row * k + b * kBlock;
      float bmax = 0.0f;
      for (int i = 0; i < kBlock; ++i) bmax = std::max(bmax, std::fabs(x[i]));
      // Scale 2^round(log2(amax / 6)); an all-zero block gets code 127 (scale 1).
      int c = 127;
      if (bmax > 0.0f) {
        const double e = std::round(std::log2(static_cast<double>(bmax) / 6.0));
        c = static_cast<int>(std::min(std::max(127.0 + e, 0.0), 254.0));
      }
      scales[row * blocks + b] = static_cast<uint8_t>(c);
      const float s = num::e8m0_to_f32(static_cast<uint8_t>(c));
      uint8_t* p = dst + row * (k / 2) + b * (kBlock / 2);
      for (int i = 0; i < kBlock; ++i) {
        const uint8_t code = num::f32_to_e2m1(x[i] / s);
        p[i / 2] = static_cast<uint8_t>(p[i / 2] | (code << (4 * (i & 1))));
      }
    }
  }
}

}  // namespace

void quantize_fp4_expert(const float* w, int64_t e, QuantizedFc* out) {
  const FcFormat& f = out->format;
  const int64_t n = out->n, k = out->k;
  const int block = f.info().default_block;
  uint8_t* scales = out->scales.data() + e * n * (k / block);
  uint8_t* codes = out->weight.data() + e * n * (k / 2);
  std::vector<uint8_t> k_packed;
  uint8_t* dst = codes;
  if (f.fp4_layout == Fp4Layout::kNPacked) {
    k_packed.assign(static_cast<size_t>(n * (k / 2)), 0);
    dst = k_packed.data();
  } else {
    std::memset(dst, 0, static_cast<size_t>(n * (k / 2)));
  }
  if (f.format == WeightFormat::kNvFp4) {
    quantize_nvfp4(w, n, k, &out->global_scale[e], scales, dst);
  } else {
    quantize_mxfp4(w, n, k, &out->global_scale[e], scales, dst);
  }
  if (f.fp4_layout == Fp4Layout::kNPacked) fp4_repack(Fp4Layout::kKPacked, dst, 1, n, k, codes);
}

template <typename T>
void dequantize_fp4_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                        int64_t row, T* out) {
  if (f.format == WeightFormat::kNvFp4) {
    fp4_row<T, 16, DType::kF8E4M3>(f, w, n, k, e, row, out);
  } else {
    fp4_row<T, 32, DType::kF8E8M0>(f, w, n, k, e, row, out);
  }
}

template void dequantize_fp4_row<float>(const FcFormat&, const FcWeights&, int64_t, int64_t,
                                        int64_t, int64_t, float*);
template void dequantize_fp4_row<double>(const FcFormat&, const FcWeights&, int64_t, int64_t,
                                         int64_t, int64_t, double*);

}  // namespace formats

void fp4_repack(Fp4Layout from, const uint8_t* src, int64_t experts, int64_t n, int64_t k,
                uint8_t* dst) {
  // Both directions transpose a matrix of nibbles stored two per byte along its columns: K-packed
  // is [N, K] packed along K, N-packed is [K, N] packed along N.
  const int64_t rows = from == Fp4Layout::kKPacked ? n : k;
  const int64_t cols = from == Fp4Layout::kKPacked ? k : n;
  for (int64_t e = 0; e < experts; ++e) {
    const uint8_t* s = src + e * rows * (cols / 2);
    uint8_t* d = dst + e * rows * (cols / 2);
    for (int64_t c = 0; c < cols; ++c) {
      const int shift = static_cast<int>(c & 1) * 4;
      const uint8_t* col = s + c / 2;
      for (int64_t j = 0; j < rows / 2; ++j) {  // dst byte (c, j) holds rows 2j and 2j + 1
        const unsigned lo = (col[(2 * j) * (cols / 2)] >> shift) & 15u;
        const unsigned hi = (col[(2 * j + 1) * (cols / 2)] >> shift) & 15u;
        d[c * (rows / 2) + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

}  // namespace qmoe

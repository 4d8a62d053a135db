// Integer formats. Layout (per expert):
//   weight  [N, ceil(K*bits/8)]     row n is an LSB-first bitstream, code k at bits [k*bits, +bits)
//   scales  [N] or [N, K/bs]        scale_dtype: f32, f16 or bf16
//   zp      [ceil(N*bits/8)]        per channel: one LSB-first stream along N
//           [N, ceil(K/bs*bits/8)]  blocked: one stream per row, along the blocks
// w = (q - zp) * scale; without zero points zp = 2^(bits-1).
#include "core/formats/int_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/formats/codec.h"

namespace qmoe {
namespace formats {

namespace {

// One row's inputs, resolved once per row so that the block loop only indexes.
struct IntRow {
  const uint8_t* codes;        // the row's bitstream
  const uint8_t* scales;       // the scale tensor
  int64_t scale_index;         // index of the row's first scale
  const uint8_t* zero_points;  // the row's zero-point stream, nullptr when symmetric
  int64_t zp_index;            // code index of the row's first zero point in that stream
  int64_t k;
  int64_t block;  // == k for per-channel scales
};

// Dequantizes `count` codes of a bitstream that starts on a byte boundary. Eight codes always fill
// exactly kBits bytes, so the main loops decode whole bytes (or 3-byte groups) with fixed shifts;
// only a per-channel row whose K is not a multiple of 8 has a tail.
template <typename T, int kBits>
void int_span(const uint8_t* p, int64_t count, int zp, T s, T* out) {
  int64_t done = 0;
  if constexpr (kBits == 8) {
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(static_cast<int>(p[i]) - zp) * s;
    done = count;
  } else if constexpr (kBits == 4) {
    const int64_t bytes = count / 2;
    for (int64_t j = 0; j < bytes; ++j) {
      const int b = p[j];
      out[2 * j] = static_cast<T>((b & 15) - zp) * s;
      out[2 * j + 1] = static_cast<T>((b >> 4) - zp) * s;
    }
    done = 2 * bytes;
  } else if constexpr (kBits == 2) {
    const int64_t bytes = count / 4;
    for (int64_t j = 0; j < bytes; ++j) {
      const int b = p[j];
      out[4 * j] = static_cast<T>((b & 3) - zp) * s;
      out[4 * j + 1] = static_cast<T>(((b >> 2) & 3) - zp) * s;
      out[4 * j + 2] = static_cast<T>(((b >> 4) & 3) - zp) * s;
      out[4 * j + 3] = static_cast<T>((b >> 6) - zp) * s;
    }
    done = 4 * bytes;
  } else {
    static_assert(kBits == 3, "integer formats are 2, 3, 4 or 8 bits");
    const int64_t groups = count / 8;  // 8 codes = 3 bytes; codes 2 and 5 straddle bytes
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* b = p + 3 * g;
      const uint32_t v =
          b[0] | (static_cast<uint32_t>(b[1]) << 8) | (static_cast<uint32_t>(b[2]) << 16);
      for (int i = 0; i < 8; ++i) {
        out[8 * g + i] = static_cast<T>(static_cast<int>((v >> (3 * i)) & 7u) - zp) * s;
      }
    }
    done = 8 * groups;
  }
  for (int64_t i = done; i < count; ++i) {
    out[i] = static_cast<T>(static_cast<int>(read_bits(p, i, kBits)) - zp) * s;
  }
}

template <typename T, int kBits, DType kScale>
void int_row(const IntRow& r, T* out) {
  const int64_t blocks = r.k / r.block;
  for (int64_t b = 0; b < blocks; ++b) {
    const T s = static_cast<T>(load_scale<kScale>(r.scales, r.scale_index + b));
    const int zp = r.zero_points ? static_cast<int>(read_bits(r.zero_points, r.zp_index + b, kBits))
                                 : 1 << (kBits - 1);
    // A block holds a multiple of 8 codes (block sizes are >= 16), so it starts on a byte.
    int_span<T, kBits>(r.codes + b * r.block * kBits / 8, r.block, zp, s, out + b * r.block);
  }
}

template <typename T>
using IntRowFn = void (*)(const IntRow&, T*);

template <typename T, int kBits>
IntRowFn<T> int_row_for_scale(DType scale) {
  switch (scale) {
    case DType::kF16:
      return &int_row<T, kBits, DType::kF16>;
    case DType::kBF16:
      return &int_row<T, kBits, DType::kBF16>;
    default:
      return &int_row<T, kBits, DType::kF32>;
  }
}

template <typename T>
IntRowFn<T> int_row_fn(int bits, DType scale) {
  switch (bits) {
    case 2:
      return int_row_for_scale<T, 2>(scale);
    case 3:
      return int_row_for_scale<T, 3>(scale);
    case 4:
      return int_row_for_scale<T, 4>(scale);
    default:
      return int_row_for_scale<T, 8>(scale);
  }
}

// round_half_away(v) clamped to [lo, hi]; clamping in float keeps huge quotients from overflowing
// the int conversion.
int round_clamp(float v, int lo, int hi) {
  // Clamp first (the bounds are integers, so clamping commutes with rounding), then round half
  // away from zero from the truncated value and the exact remainder c - trunc(c): the same result
  // as std::round, without a library call, and vectorizable with plain SSE2.
  const float c = std::min(std::max(v, static_cast<float>(lo)), static_cast<float>(hi));
  const int t = static_cast<int>(c);
  const float frac = c - static_cast<float>(t);
  return t + (frac >= 0.5f) - (frac <= -0.5f);
}

// Codes of `count` values at one scale, written to q (vectorizable), then packed by the caller.
void round_codes(const float* x, int64_t count, float scale, int lo, int hi, int offset,
                 uint8_t* q) {
  for (int64_t i = 0; i < count; ++i) {
    q[i] = static_cast<uint8_t>(round_clamp(x[i] / scale, lo, hi) + offset);
  }
}

// Packs `count` codes into the bitstream at code index `at` (bytes there must be zero).
void pack_codes(const uint8_t* q, int64_t count, int bits, uint8_t* codes, int64_t at) {
  if (bits == 8) {
    std::memcpy(codes + at, q, static_cast<size_t>(count));
    return;
  }
  if (bits == 4 && at % 2 == 0) {
    int64_t i = 0;
    for (; i + 1 < count; i += 2) {
      codes[(at + i) / 2] = static_cast<uint8_t>(q[i] | (q[i + 1] << 4));
    }
    if (i < count) write_bits(codes, at + i, bits, q[i]);
    return;
  }
  for (int64_t i = 0; i < count; ++i) write_bits(codes, at + i, bits, q[i]);
}

// Quantizes x[0, count) at `scale` with codes in [lo, hi] + offset, chunk by chunk.
void quantize_codes(const float* x, int64_t count, float scale, int lo, int hi, int offset,
                    int bits, uint8_t* codes, int64_t at) {
  constexpr int64_t kChunk = 256;
  uint8_t q[kChunk];
  for (int64_t i0 = 0; i0 < count; i0 += kChunk) {
    const int64_t c = std::min(kChunk, count - i0);
    if (scale > 0.0f) {
      round_codes(x + i0, c, scale, lo, hi, offset, q);
    } else {
      std::memset(q, offset, static_cast<size_t>(c));
    }
    pack_codes(q, c, bits, codes, at + i0);
  }
}

// Quantization of one block (or one per-channel row) of `count` values.
struct IntBlockQuant {
  float scale;  // as stored
  int zp;
};

IntBlockQuant quantize_int_block(const float* x, int64_t count, int bits, bool asymmetric,
                                 DType scale_dtype, uint8_t* scales, int64_t scale_index,
                                 uint8_t* codes, int64_t code_index) {
  const int half = 1 << (bits - 1);
  const int qmax = (1 << bits) - 1;
  IntBlockQuant r{0.0f, half};
  if (!asymmetric) {
    float amax = 0.0f;
    for (int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(x[i]));
    // amax / (2^(b-1) - 0.5): the clipped top code 2^(b-1)-1 then lands half a step below amax,
    // so the error is at most half a step everywhere and the scale stays non-negative.
    r.scale = store_float_scale(scale_dtype, amax / (static_cast<float>(half) - 0.5f), scales,
                                scale_index);
    quantize_codes(x, count, r.scale, -half, half - 1, half, bits, codes, code_index);
    return r;
  }
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  r.scale =
      store_float_scale(scale_dtype, (hi - lo) / static_cast<float>(qmax), scales, scale_index);
  if (r.scale > 0.0f) r.zp = round_clamp(-lo / r.scale, 0, qmax);
  // round(w / s) + zp, clamped: the same as round_clamp(w / s, -zp, qmax - zp) + zp.
  quantize_codes(x, count, r.scale, -r.zp, qmax - r.zp, r.zp, bits, codes, code_index);
  return r;
}

}  // namespace

void quantize_int_expert(const float* w, int64_t e, QuantizedFc* out) {
  const FcFormat& f = out->format;
  const int bits = f.bits();
  const int64_t n = out->n, k = out->k;
  const int64_t block = f.block_size ? f.block_size : k;
  const int64_t blocks = k / block;
  const int64_t row_bytes = packed_bytes(k, bits);
  uint8_t* codes = out->weight.data() + e * n * row_bytes;
  std::memset(codes, 0, static_cast<size_t>(n * row_bytes));
  // Per-channel zero points are one stream per expert (along N); blocked ones one stream per row.
  const int64_t zp_stream_bytes = f.block_size ? packed_bytes(blocks, bits) : packed_bytes(n, bits);
  uint8_t* zps = nullptr;
  if (f.zero_points) {
    const int64_t expert_zp_bytes = f.block_size ? n * zp_stream_bytes : zp_stream_bytes;
    zps = out->zero_points.data() + e * expert_zp_bytes;
    std::memset(zps, 0, static_cast<size_t>(expert_zp_bytes));
  }
  for (int64_t row = 0; row < n; ++row) {
    for (int64_t b = 0; b < blocks; ++b) {
      const IntBlockQuant q = quantize_int_block(
          w + row * k + b * block, block, bits, f.zero_points, f.scale_dtype, out->scales.data(),
          (e * n + row) * blocks + b, codes + row * row_bytes, b * block);
      if (zps) {
        if (f.block_size) {
          write_bits(zps + row * zp_stream_bytes, b, bits, static_cast<unsigned>(q.zp));
        } else {
          write_bits(zps, row, bits, static_cast<unsigned>(q.zp));
        }
      }
    }
  }
}

template <typename T>
void dequantize_int_row(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, int64_t e,
                        int64_t row, T* out) {
  const int bits = f.bits();
  const int64_t blocks = f.block_size ? k / f.block_size : 1;
  IntRow r;
  r.codes = static_cast<const uint8_t*>(w.weight.data) + (e * n + row) * packed_bytes(k, bits);
  r.scales = static_cast<const uint8_t*>(w.scales.data);
  r.scale_index = (e * n + row) * blocks;
  r.zero_points = nullptr;
  r.zp_index = 0;
  if (f.zero_points) {
    const uint8_t* zp = static_cast<const uint8_t*>(w.zero_points.data);
    if (f.block_size) {
      r.zero_points = zp + (e * n + row) * packed_bytes(blocks, bits);
    } else {
      r.zero_points = zp + e * packed_bytes(n, bits);
      r.zp_index = row;
    }
  }
  r.k = k;
  r.block = f.block_size ? f.block_size : k;
  int_row_fn<T>(bits, f.scale_dtype)(r, out);
}

template void dequantize_int_row<float>(const FcFormat&, const FcWeights&, int64_t, int64_t,
                                        int64_t, int64_t, float*);
template void dequantize_int_row<double>(const FcFormat&, const FcWeights&, int64_t, int64_t,
                                         int64_t, int64_t, double*);

}  // namespace formats
}  // namespace qmoe

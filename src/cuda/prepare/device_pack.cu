// device_pack.h's kernels. Each thread builds whole output units (a lane's four words of a chunk, a
// scale entry, a byte), computing every bit position from mma_pack.h's shared definitions
// (logical_row, mma_fp4_bit, mma_fp8_bit, mma_scale_index) rather than from the host's tables, so
// the host code is an independent check of these.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/formats/codec.h"
#include "core/formats/fp4_e4m3.h"
#include "core/numeric.h"
#include "cuda/common/cuda_check.h"
#include "cuda/prepare/device_pack.h"

namespace qmoe::cuda {
namespace {

constexpr int kThreads = 256;

// Calls f(i) for i in [0, count), grid-stride (a layer's largest output, DeepSeek-V3's FP8 words,
// is ~3e9 bytes: more units than one launch's blocks at one unit per thread).
template <typename F>
__global__ void for_each_kernel(int64_t count, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    f(i);
  }
}

template <typename F>
Status launch_each(int64_t count, const F& f, cudaStream_t stream, const char* what) {
  if (count <= 0) return Status::ok();
  const int64_t blocks = std::min<int64_t>((count + kThreads - 1) / kThreads, int64_t{1} << 20);
  for_each_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(count, f);
  return cuda_status(cudaGetLastError(), what);
}

// The source row of packed row pr of expert e, or null for padding. linear: the gated
// concatenated map's linear rows from a tensor of their own (mma_pack_fp8's raw_linear).
__device__ const uint8_t* source_row(const MmaPackShape& s, const uint8_t* raw,
                                     const uint8_t* linear, int64_t e, int64_t pr,
                                     int64_t row_bytes) {
  const int64_t lr = s.logical_row(pr);
  if (lr < 0) return nullptr;
  if (linear == nullptr) return raw + (e * s.n + lr) * row_bytes;
  return lr < s.units ? raw + (e * s.units + lr) * row_bytes
                      : linear + (e * s.units + lr - s.units) * row_bytes;
}

// One lane's chunk: unit i = ((e * tiles + m) * chunks + c) * 32 + lane, its four words at 4 i.
// Lane (g, t) = (lane / 4, lane % 4) packs codes of rows g and g + 8 of tile m (mma_pack.h).
struct LaneUnit {
  int64_t e, m, c;
  int t;
  const uint8_t* rows[2];  // the source rows of packed rows 16 m + g and 16 m + g + 8, or null
};
__device__ LaneUnit lane_unit(const MmaPackShape& s, int64_t i, const uint8_t* raw,
                              const uint8_t* linear, int64_t row_bytes) {
  LaneUnit u;
  const int lane = static_cast<int>(i % 32);
  int64_t rest = i / 32;
  u.c = rest % s.chunks;
  rest /= s.chunks;
  u.m = rest % s.tiles;
  u.e = rest / s.tiles;
  u.t = lane % 4;
  for (int h = 0; h < 2; ++h) {
    u.rows[h] = source_row(s, raw, linear, u.e, 16 * u.m + lane / 4 + 8 * h, row_bytes);
  }
  return u;
}

struct PackInt {
  MmaPackShape s;
  const uint8_t* raw;
  uint32_t* out;
  __device__ void operator()(int64_t i) const {
    const int b = s.bits, per_word = 16 / b, sc = s.steps_per_chunk;
    const LaneUnit u = lane_unit(s, i, raw, nullptr, formats::packed_bytes(s.k, b));
    const unsigned mask = (1u << b) - 1u;
    const unsigned mid = 1u << (b - 1);
    const int64_t steps = s.k / 16;
    uint32_t w[4] = {0, 0, 0, 0};
    if (mma_step_major(s.codes, b)) {  // natural K, top bits flipped, words a step apart
      for (int st = 0; st < sc; ++st) {
        const int64_t step = u.c * sc + st;
        for (int pj = 0; pj < 4; ++pj) {  // pair 4 st + pj: row g + 8 (pj & 1), k + 8 (pj >> 1)
          const uint8_t* row = u.rows[pj & 1];
          const int pair = 4 * st + pj;
          for (int h = 0; h < 2; ++h) {
            const int64_t k = 16 * step + 2 * u.t + 8 * (pj >> 1) + h;
            const unsigned q = row != nullptr && step < steps ? formats::read_bits(row, k, b) : mid;
            w[pair / per_word] |= (q ^ mid) << (16 * h + b * (pair % per_word));
          }
        }
      }
      uint32_t* chunk = out + (i / 32) * 128;
      const int lane = static_cast<int>(i % 32);
      for (int j = 0; j < 4; ++j) chunk[mma_chunk_word(b, lane, j)] = w[j];
      return;
    }
    for (int st = 0; st < sc; ++st) {
      const int64_t step = u.c * sc + st;
      const int64_t k0 = 16 * step + 4 * u.t;
      for (int rr = 0; rr < 2; ++rr) {
        const bool real = u.rows[rr] != nullptr && step < steps;
        const unsigned quad = real ? formats::read_quad(u.rows[rr], k0, b) : 0u;
        for (int q = 0; q < 4; ++q) {  // code k0 + q: pair rr + 2 (q / 2), half q % 2
          const int pair = 4 * st + rr + 2 * (q >> 1);
          const unsigned code = real ? (quad >> (b * q)) & mask : mid;
          w[pair / per_word] |= code << (16 * (q & 1) + b * (pair % per_word));
        }
      }
    }
    reinterpret_cast<uint4*>(out)[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

// E2M1 byte v (low nibble the first code) of pair j, its bits where mma_fp4_bit puts them.
__device__ uint32_t fp4_spread(int mag_bit, int j, unsigned v) {
  uint32_t w = 0;
  for (int half = 0; half < 2; ++half) {
    const unsigned code = (v >> (4 * half)) & 15u;
    for (int i = 0; i < 4; ++i) w |= ((code >> i) & 1u) << mma_fp4_bit(mag_bit, j, half, i);
  }
  return w;
}

struct PackFp4 {
  MmaPackShape s;
  const uint8_t* raw;
  uint32_t* out;
  __device__ void operator()(int64_t i) const {
    const LaneUnit u = lane_unit(s, i, raw, nullptr, s.k / 2);
    const int64_t steps = s.k / 16;
    const uint8_t *ra = u.rows[0], *rb = u.rows[1];
    uint32_t w[4] = {0, 0, 0, 0};
    for (int st = 0; st < 4; ++st) {
      const int64_t step = u.c * 4 + st;
      if (step >= steps) break;  // +0
      const int64_t at = (16 * step + 4 * u.t) / 2;
      if (ra != nullptr) {
        w[st] |= fp4_spread(s.fp4_mag_bit, 0, ra[at]) | fp4_spread(s.fp4_mag_bit, 2, ra[at + 1]);
      }
      if (rb != nullptr) {
        w[st] |= fp4_spread(s.fp4_mag_bit, 1, rb[at]) | fp4_spread(s.fp4_mag_bit, 3, rb[at + 1]);
      }
    }
    reinterpret_cast<uint4*>(out)[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

// An e4m3 code of half h of pair jj, its bits where mma_fp8_bit puts them.
__device__ uint32_t fp8_spread(int mag_bit, int jj, int half, unsigned v) {
  uint32_t w = 0;
  for (int i = 0; i < 8; ++i) w |= ((v >> i) & 1u) << mma_fp8_bit(mag_bit, jj, half, i);
  return w;
}

struct PackFp8 {
  MmaPackShape s;
  const uint8_t *raw, *linear;
  uint32_t* out;
  __device__ void operator()(int64_t i) const {
    const LaneUnit u = lane_unit(s, i, raw, linear, s.k);
    const int64_t steps = s.k / 16;
    uint32_t w[4] = {0, 0, 0, 0};
    for (int st = 0; st < 2; ++st) {
      const int64_t step = u.c * 2 + st;
      if (step >= steps) break;  // +0
      const int64_t k0 = 16 * step + 4 * u.t;
      for (int jj = 0; jj < 2; ++jj) {  // pair j = jj + 2 j2: row g + 8 jj, k0 + 2 j2 + {0, 1}
        const uint8_t* row = u.rows[jj];
        if (row == nullptr) continue;
        for (int j2 = 0; j2 < 2; ++j2) {
          w[2 * st + j2] |= fp8_spread(s.fp8_mag_bit, jj, 0, row[k0 + 2 * j2]) |
                            fp8_spread(s.fp8_mag_bit, jj, 1, row[k0 + 2 * j2 + 1]);
        }
      }
    }
    reinterpret_cast<uint4*>(out)[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

// Entry i = (e * tiles * 16 + pr) * scale_blocks + b of the tile-ordered layout, which is also
// its index there (mma_scale_index): its logical row and ORT K block, or -1.
struct ScaleEntry {
  int64_t e, pr, b, lr, kb;
};
__device__ ScaleEntry scale_entry(const MmaPackShape& s, int64_t i) {
  ScaleEntry x;
  x.b = i % s.scale_blocks;
  const int64_t row = i / s.scale_blocks;
  x.pr = row % (s.tiles * 16);
  x.e = row / (s.tiles * 16);
  x.lr = s.logical_row(x.pr);
  x.kb = x.b < s.k_blocks() ? x.b : -1;
  return x;
}

struct PackScales {
  MmaPackShape s;
  const uint8_t* scales;
  int elem_bytes;
  uint8_t* out;
  __device__ void operator()(int64_t i) const {
    const ScaleEntry x = scale_entry(s, i);
    uint8_t* dst = out + mma_scale_index(s, x.e, x.pr, x.b) * elem_bytes;
    if (x.lr < 0 || x.kb < 0) {
      for (int j = 0; j < elem_bytes; ++j) dst[j] = 0;
      return;
    }
    const int64_t src_rows = (s.n + s.scale_rows - 1) / s.scale_rows;
    const uint8_t* src =
        scales + ((x.e * src_rows + x.lr / s.scale_rows) * s.k_blocks() + x.kb) * elem_bytes;
    for (int j = 0; j < elem_bytes; ++j) dst[j] = src[j];
  }
};

struct PackZeroPoints {
  MmaPackShape s;
  const uint8_t* zp;
  uint8_t* out;
  __device__ void operator()(int64_t i) const {
    const ScaleEntry x = scale_entry(s, i);
    unsigned q = 1u << (s.bits - 1);  // padding: the symmetric point
    if (x.lr >= 0 && x.kb >= 0) {
      // Blocks: a row of k_blocks codes per (expert, row); per channel: N codes per expert.
      q = s.block_size
              ? formats::read_bits(
                    zp + (x.e * s.n + x.lr) * formats::packed_bytes(s.k_blocks(), s.bits), x.kb,
                    s.bits)
              : formats::read_bits(zp + x.e * formats::packed_bytes(s.n, s.bits), x.lr, s.bits);
    }
    out[mma_scale_index(s, x.e, x.pr, x.b)] = static_cast<uint8_t>(q);
  }
};

struct GatedRowScales {
  const uint8_t *gate, *linear;
  int elem_bytes;
  int64_t inter, nbk, block_rows;
  uint8_t* out;
  __device__ void operator()(int64_t i) const {  // i = (e * 2 I + r) * nbk + b
    const int64_t b = i % nbk, row = i / nbk;
    const int64_t r = row % (2 * inter), e = row / (2 * inter);
    const uint8_t* src = r < inter ? gate : linear;
    const int64_t nbn = (inter + block_rows - 1) / block_rows;
    const uint8_t* from = src + ((e * nbn + (r % inter) / block_rows) * nbk + b) * elem_bytes;
    for (int j = 0; j < elem_bytes; ++j) out[i * elem_bytes + j] = from[j];
  }
};

struct Fp4KPacked {
  const uint8_t* src;
  int64_t n, k;
  uint8_t* out;
  __device__ void operator()(int64_t i) const {  // out byte (e, row r, j): k = 2 j and 2 j + 1
    const int64_t per_expert = n * (k / 2);
    const int64_t e = i / per_expert, rest = i % per_expert;
    const int64_t r = rest / (k / 2), j = rest % (k / 2);
    const uint8_t* s = src + e * per_expert + r / 2;  // N-packed [K, N / 2]: byte (k, r / 2)
    const int shift = static_cast<int>(r & 1) * 4;
    const unsigned lo = (s[(2 * j) * (n / 2)] >> shift) & 15u;
    const unsigned hi = (s[(2 * j + 1) * (n / 2)] >> shift) & 15u;
    out[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
};

__device__ float scale_f32(const uint8_t* p, DType dt) {
  switch (dt) {
    case DType::kF16:
      return num::f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
    case DType::kBF16:
      return num::bf16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
    default:
      return num::bits_f32(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
  }
}

struct MixedScales {
  MixedCodes c;
  WeightFormat format;
  DType scale_dtype, act;
  bool zero_points;
  int bits, block_size;
  int64_t n, chunk, kb;
  const uint8_t *scales, *zp;
  const float* global;
  void* scales_out;
  float* zeros_out;
  GluRows glu;
  int64_t inter;
  __device__ void operator()(int64_t i) const {  // i = (e * kb + b) * n + row, mixed_prepare's at
    const int64_t row = i % n, eb = i / n;
    const int64_t r = glu_source_row(glu, inter, row);  // the row it reads (ORT's order)
    const int64_t b = eb % kb, e = eb / kb;
    const int64_t es = scale_dtype == DType::kF32 ? 4 : 2;  // f32, f16 or bf16 scales
    float s;
    if (format == WeightFormat::kFp8) {
      s = global[e];
    } else if (format == WeightFormat::kFp8Block) {
      const int64_t rb = formats::ceil_div(n, chunk);
      s = scale_f32(scales + ((e * rb + r / chunk) * kb + b) * es, scale_dtype);
    } else {
      s = scale_f32(scales + ((e * n + r) * kb + b) * es, scale_dtype);
    }
    if (mixed_scale_bytes(c) == 2) {
      static_cast<uint16_t*>(scales_out)[i] =
          act == DType::kBF16 ? num::f32_to_bf16(s) : num::f32_to_f16(s);
    } else {
      static_cast<float*>(scales_out)[i] = s;
    }
    if (!mixed_has_zeros(c)) return;
    int64_t q = int64_t{1} << (bits - 1);  // ORT's implicit zero point
    if (zero_points) {
      q = block_size == 0
              ? formats::read_bits(zp + e * formats::packed_bytes(n, bits), r, bits)
              : formats::read_bits(zp + (e * n + r) * formats::packed_bytes(kb, bits), b, bits);
    }
    const int64_t mid = int64_t{1} << (bits - 1);  // the signed codes are q - mid already
    zeros_out[i] = -static_cast<float>(q - mid) * s;
  }
};

// One chunk of an MXFP4 e4m3 copy (fp4_e4m3.h), i the scale's index: the mixed-input GEMM's
// chunks of 64 with scales [E, kq / 64, n] (i = (e * kb + b) * n + row), or the FP8 GEMM's of
// 128 with scales [E, n, kq / 128] (kRowScales: i = (e * n + row) * kb + b); codes [E, n, kq] in
// place, kq = k rounded up to the chunk (codes past k zero).
template <int kChunk, bool kRowScales>
struct Mxfp4E4m3 {
  const uint8_t *codes, *scales;
  const float* global;
  int64_t n, k, kq;
  uint8_t* codes_out;
  float* scales_out;
  int32_t* inexact;
  __device__ void operator()(int64_t i) const {
    const int64_t kb = kq / kChunk;
    int64_t b, er;
    if constexpr (kRowScales) {
      b = i % kb, er = i / kb;
    } else {
      const int64_t row = i % n, e = i / (n * kb);
      b = (i / n) % kb, er = e * n + row;
    }
    const int64_t k0 = b * kChunk;
    const int valid = static_cast<int>(k - k0 < kChunk ? k - k0 : kChunk);
    alignas(16) uint8_t out[kChunk];
    float s;
    const bool ok =
        formats::mxfp4_chunk_to_e4m3<kChunk>(codes + er * (k / 2) + k0 / 2,
                                             scales + er * (k / 32) + k0 / 32, valid,
                                             global[er / n], out, &s);
    uint4* dst = reinterpret_cast<uint4*>(codes_out + er * kq + k0);
    for (int j = 0; j < kChunk / 16; ++j) dst[j] = reinterpret_cast<const uint4*>(out)[j];
    scales_out[i] = s;
    if (!ok) atomicOr(inexact, 1);
  }
};

int64_t lane_units(const MmaPackShape& s, int64_t experts) {
  return experts * s.tiles * s.chunks * 32;
}
int64_t scale_entries(const MmaPackShape& s, int64_t experts) {
  return experts * s.tiles * 16 * s.scale_blocks;
}

}  // namespace

Status device_pack_int(const MmaPackShape& s, const uint8_t* raw, int64_t experts, uint32_t* out,
                       cudaStream_t stream) {
  return launch_each(lane_units(s, experts), PackInt{s, raw, out}, stream, "device_pack_int");
}

Status device_pack_fp4(const MmaPackShape& s, const uint8_t* raw, int64_t experts, uint32_t* out,
                       cudaStream_t stream) {
  return launch_each(lane_units(s, experts), PackFp4{s, raw, out}, stream, "device_pack_fp4");
}

Status device_pack_fp8(const MmaPackShape& s, const uint8_t* raw, const uint8_t* raw_linear,
                       int64_t experts, uint32_t* out, cudaStream_t stream) {
  return launch_each(lane_units(s, experts), PackFp8{s, raw, raw_linear, out}, stream,
                     "device_pack_fp8");
}

Status device_pack_scales(const MmaPackShape& s, const uint8_t* scales, int elem_bytes,
                          int64_t experts, uint8_t* out, cudaStream_t stream) {
  return launch_each(scale_entries(s, experts), PackScales{s, scales, elem_bytes, out}, stream,
                     "device_pack_scales");
}

Status device_pack_zero_points(const MmaPackShape& s, const uint8_t* zp, int64_t experts,
                               uint8_t* out, cudaStream_t stream) {
  return launch_each(scale_entries(s, experts), PackZeroPoints{s, zp, out}, stream,
                     "device_pack_zero_points");
}

Status device_gated_row_scales(const MmaPackShape& s, const uint8_t* gate, const uint8_t* linear,
                               int elem_bytes, int64_t block_rows, int64_t experts, uint8_t* out,
                               cudaStream_t stream) {
  const int64_t nbk = s.k_blocks();
  return launch_each(experts * 2 * s.units * nbk,
                     GatedRowScales{gate, linear, elem_bytes, s.units, nbk, block_rows, out},
                     stream, "device_gated_row_scales");
}

Status device_fp4_k_packed(const uint8_t* n_packed, int64_t experts, int64_t n, int64_t k,
                           uint8_t* out, cudaStream_t stream) {
  return launch_each(experts * n * (k / 2), Fp4KPacked{n_packed, n, k, out}, stream,
                     "device_fp4_k_packed");
}

Status device_mixed_scales(MixedCodes c, const FcFormat& f, DType act, int64_t experts, int64_t n,
                           int64_t k, const uint8_t* scales, const uint8_t* zero_points,
                           const float* global_scale, void* scales_out, float* zeros_out,
                           cudaStream_t stream, GluRows glu, int64_t inter) {
  std::string why;
  if (!glu_rows_fit(glu, n, inter, &why)) return Status::invalid("device_mixed_scales: " + why);
  MixedScales m;
  m.c = c;
  m.format = f.format;
  m.scale_dtype = f.scale_dtype;
  m.act = act;
  m.zero_points = f.zero_points;
  m.bits = f.info().code_bits;
  m.block_size = f.block_size;
  m.n = n;
  m.chunk = f.block_size == 0 ? k : f.block_size;
  m.kb = k / m.chunk;
  m.scales = scales;
  m.zp = zero_points;
  m.global = global_scale;
  m.scales_out = scales_out;
  m.zeros_out = zeros_out;
  m.glu = glu;
  m.inter = inter;
  return launch_each(experts * m.kb * n, m, stream, "device_mixed_scales");
}

Status device_mxfp4_e4m3(const uint8_t* codes, const uint8_t* scales, const float* global_scale,
                         int64_t experts, int64_t n, int64_t k, uint8_t* codes_out,
                         float* scales_out, int32_t* inexact, cudaStream_t stream) {
  if (k % formats::kFp4E4m3Chunk != 0) {
    return Status::invalid("device_mxfp4_e4m3: k: expected a multiple of " +
                           std::to_string(formats::kFp4E4m3Chunk) + ", got " + std::to_string(k));
  }
  constexpr int kChunk = formats::kFp4E4m3Chunk;
  return launch_each(experts * (k / kChunk) * n,
                     Mxfp4E4m3<kChunk, false>{codes, scales, global_scale, n, k, k, codes_out,
                                              scales_out, inexact},
                     stream, "device_mxfp4_e4m3");
}

Status device_mxfp4_e4m3_rows(const uint8_t* codes, const uint8_t* scales,
                              const float* global_scale, int64_t experts, int64_t n, int64_t k,
                              int64_t kq, uint8_t* codes_out, float* scales_out, int32_t* inexact,
                              cudaStream_t stream) {
  constexpr int kChunk = formats::kFp4E4m3RowsChunk;
  if (k <= 0 || k % 32 != 0 || kq < k || kq % kChunk != 0 || kq - k >= kChunk) {
    return Status::invalid("device_mxfp4_e4m3_rows: k, kq: expected k a multiple of 32 and kq "
                           "the next multiple of " + std::to_string(kChunk) + ", got " +
                           std::to_string(k) + ", " + std::to_string(kq));
  }
  return launch_each(experts * n * (kq / kChunk),
                     Mxfp4E4m3<kChunk, true>{codes, scales, global_scale, n, k, kq, codes_out,
                                             scales_out, inexact},
                     stream, "device_mxfp4_e4m3_rows");
}

}  // namespace qmoe::cuda

// Packing of integer codes into the decode kernels' fragment order (see mma_pack.h).
#include "core/formats/mma_pack.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "core/formats/codec.h"
#include "core/parallel.h"

namespace qmoe {

namespace {

// Where pair G (of a chunk), half h sits for lane L: word index and bit.
struct Slot {
  int word, bit;
};

Slot slot_of(int bits, int pair, int half) {
  const int p = 16 / bits;
  return {pair / p, half * 16 + bits * (pair % p)};
}

}  // namespace

bool mma_pack_supported(const FcFormat& f, int64_t k) {
  if (f.info().kind == FormatKind::kFp4) return k % 16 == 0 && k > 0;
  if (f.info().kind == FormatKind::kFp8) {
    // fp8_block: K blocks of whole 32-K chunks (the kernel's scale blocks then end at chunk ends).
    const int bs = f.format == WeightFormat::kFp8Block ? f.block_size : 0;
    if (bs != 0 && (bs < 32 || (bs & (bs - 1)) != 0)) return false;
    return k % 16 == 0 && k > 0;
  }
  if (f.info().kind != FormatKind::kInteger) return false;
  const int b = f.bits();
  if (b != 2 && b != 3 && b != 4 && b != 8) return false;
  // Scale blocks: per channel, or a power of two of at least one K step (16).
  if (f.block_size != 0 && (f.block_size < 16 || (f.block_size & (f.block_size - 1)) != 0)) {
    return false;
  }
  return k % 16 == 0 && k > 0;
}

MmaPackShape mma_pack_shape(const FcFormat& f, int64_t n, int64_t k, MmaRowMap map, int64_t inter,
                            DType act) {
  MmaPackShape s;
  const bool fp4 = f.info().kind == FormatKind::kFp4;
  if (fp4) {
    s.codes = f.format == WeightFormat::kNvFp4 ? MmaCodes::kNvFp4 : MmaCodes::kMxFp4;
    s.fp4_mag_bit = act == DType::kBF16 ? 6 : 9;
  }
  const bool fp8 = f.info().kind == FormatKind::kFp8;
  if (fp8) {
    s.codes = MmaCodes::kFp8;
    s.fp8_mag_bit = act == DType::kBF16 ? 4 : 7;
  }
  s.bits = f.bits();
  s.steps_per_chunk = 16 / s.bits;
  s.n = n;
  s.k = k;
  s.map = map;
  s.units = map == MmaRowMap::kIdentity ? n : inter;
  const int64_t packed_rows = map == MmaRowMap::kIdentity ? n : 2 * ((inter + 7) / 8) * 8;
  s.tiles = (packed_rows + 15) / 16;
  const int64_t chunk_k = 16 * s.steps_per_chunk;
  s.chunks = (k + chunk_k - 1) / chunk_k;
  s.block_size = s.codes == MmaCodes::kNvFp4 || f.format == WeightFormat::kFp8 ? 0 : f.block_size;
  if (f.format == WeightFormat::kFp8Block) s.scale_rows = f.block_size;
  s.scale_blocks = s.block_size ? (s.chunks * chunk_k + s.block_size - 1) / s.block_size : 1;
  if (s.codes == MmaCodes::kNvFp4) s.fp4_blocks = s.chunks * chunk_k / 16;
  return s;
}

namespace {

// Calls f(e, pr, b, lr, kb) for every entry of the tile-ordered scale layout: lr is the logical
// row (-1 for padding), kb the ORT block index (-1 past K's blocks).
template <typename F>
void for_each_scale_entry(const MmaPackShape& s, int64_t experts, F&& f) {
  const int64_t nblk = s.k_blocks();
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t pr = 0; pr < s.tiles * 16; ++pr) {
      const int64_t lr = s.logical_row(pr);
      for (int64_t b = 0; b < s.scale_blocks; ++b) f(e, pr, b, lr, b < nblk ? b : -1);
    }
  }
}

}  // namespace

void mma_pack_scales(const MmaPackShape& s, const uint8_t* scales, int elem_bytes, int64_t experts,
                     std::vector<uint8_t>* out) {
  const int64_t nblk = s.k_blocks();
  out->assign(static_cast<size_t>(experts * s.tiles * 16 * s.scale_blocks * elem_bytes), 0u);
  for_each_scale_entry(s, experts, [&](int64_t e, int64_t pr, int64_t b, int64_t lr, int64_t kb) {
    if (lr < 0 || kb < 0) return;
    const int64_t src_rows = (s.n + s.scale_rows - 1) / s.scale_rows;
    const uint8_t* src = scales + ((e * src_rows + lr / s.scale_rows) * nblk + kb) * elem_bytes;
    std::copy(src, src + elem_bytes, out->data() + mma_scale_index(s, e, pr, b) * elem_bytes);
  });
}

void mma_pack_zero_points(const MmaPackShape& s, const uint8_t* zp, int64_t experts,
                          std::vector<uint8_t>* out) {
  const int bits = s.bits;
  const int64_t nblk = s.k_blocks();
  out->assign(static_cast<size_t>(experts * s.tiles * 16 * s.scale_blocks),
              static_cast<uint8_t>(1u << (bits - 1)));
  for_each_scale_entry(s, experts, [&](int64_t e, int64_t pr, int64_t b, int64_t lr, int64_t kb) {
    if (lr < 0 || kb < 0) return;
    // Blocks: a row of nblk codes per (expert, row); per channel: a row of N codes per expert.
    const unsigned q =
        s.block_size
            ? formats::read_bits(zp + (e * s.n + lr) * formats::packed_bytes(nblk, bits), kb, bits)
            : formats::read_bits(zp + e * formats::packed_bytes(s.n, bits), lr, bits);
    (*out)[static_cast<size_t>(mma_scale_index(s, e, pr, b))] = static_cast<uint8_t>(q);
  });
}

namespace {


// Calls f(words, st, k0, ra, rb) for every lane and K step of expert e's packed tiles: words is
// the lane's 4 words of the chunk, k0 the step's first K of the lane's codes (4 t into the step),
// or -1 for a step past K (K is a multiple of 16, so a step lies inside K or past it whole), and
// ra, rb rows g and g + 8 of the raw codes (null for padding rows). Lane (g, t)'s codes of a step
// are k0..k0 + 3 of row g (pairs 0 and 2) and of row g + 8 (pairs 1 and 3).
// raw_linear: the gated concatenated map's linear rows (I + u) from a tensor of their own
// ([E, I] rows, a separate FC3), the gate rows from raw ([E, I] rows); null: all rows from raw.
template <typename F>
void for_each_lane_step(const MmaPackShape& s, const uint8_t* raw, int64_t e, int64_t row_bytes,
                        uint32_t* dst_e, F&& f, const uint8_t* raw_linear = nullptr) {
  const int sc = s.steps_per_chunk;
  const int64_t steps = s.k / 16;
  for (int64_t m = 0; m < s.tiles; ++m) {
    const uint8_t* rows[16];
    for (int r = 0; r < 16; ++r) {
      const int64_t lr = s.logical_row(16 * m + r);
      if (lr < 0) {
        rows[r] = nullptr;
      } else if (raw_linear == nullptr) {
        rows[r] = raw + (e * s.n + lr) * row_bytes;
      } else {
        rows[r] = lr < s.units ? raw + (e * s.units + lr) * row_bytes
                               : raw_linear + (e * s.units + lr - s.units) * row_bytes;
      }
    }
    for (int64_t c = 0; c < s.chunks; ++c) {
      uint32_t* chunk = dst_e + (m * s.chunks + c) * 128;
      for (int lane = 0; lane < 32; ++lane) {
        for (int st = 0; st < sc; ++st) {
          const int64_t step = c * sc + st;
          const int64_t k0 = step < steps ? 16 * step + 4 * (lane % 4) : -1;
          f(chunk + lane * 4, st, k0, rows[lane / 4], rows[lane / 4 + 8]);
        }
      }
    }
  }
}

// Packs expert e into dst_e (words_per_expert() words, zeroed): each lane's codes of a step read at
// once (a slot at a time, the prepare of a large layer spent seconds here). The step-major widths
// (int4, int8; mma_pack.h) hold K in its natural order, lane t's codes of a step at 16 step + 2 t
// + {0, 1} and + {8, 9} (k0 = 16 step + 4 t: k0 - 2 t), each top bit flipped; they are packed lane
// by lane as the others, then each chunk's words move to their step-major places.
void pack_expert(const MmaPackShape& s, const uint8_t* raw, int64_t e, uint32_t* dst_e) {
  const int b = s.bits, per_word = 16 / b;
  const unsigned mask = (1u << b) - 1u, mid = 1u << (b - 1);
  const unsigned mid_quad = mid * (1u | 1u << b | 1u << (2 * b) | 1u << (3 * b));
  const bool step_major = mma_step_major(s.codes, b);
  for_each_lane_step(
      s, raw, e, formats::packed_bytes(s.k, b), dst_e,
      [&](uint32_t* words, int st, int64_t k0, const uint8_t* ra, const uint8_t* rb) {
        for (int rr = 0; rr < 2; ++rr) {
          const uint8_t* row = rr ? rb : ra;
          const bool real = row != nullptr && k0 >= 0;
          unsigned quad = 0;  // the other widths' codes k0..k0 + 3
          if (!step_major) quad = real ? formats::read_quad(row, k0, b) : mid_quad;
          for (int q = 0; q < 4; ++q) {  // code q: pair rr + 2 (q / 2), half q % 2
            const int pair = 4 * st + rr + 2 * (q >> 1);
            unsigned code;
            if (step_major) {  // K = 16 step + 2 t + 8 (q / 2) + q % 2, top bit flipped
              const int64_t k = k0 - (k0 % 16) / 2 + 8 * (q >> 1) + (q & 1);
              code = (real ? formats::read_bits(row, k, b) : mid) ^ mid;
            } else {
              code = (quad >> (b * q)) & mask;  // k0 + q
            }
            words[pair / per_word] |= code << (16 * (q & 1) + b * (pair % per_word));
          }
        }
      });
  if (!step_major) return;
  uint32_t lane_order[128];
  for (int64_t c = 0; c < s.tiles * s.chunks; ++c) {
    uint32_t* chunk = dst_e + c * 128;
    std::copy(chunk, chunk + 128, lane_order);
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 4; ++i) chunk[mma_chunk_word(b, lane, i)] = lane_order[4 * lane + i];
    }
  }
}

// FP4: expert e's K-packed codes into dst_e in the FP4 bit layout (mma_fp4_bit); padding +0. A
// lane's word of a step is two bytes of row g and two of row g + 8, each spread to its pair's bits
// by a table: four lookups per word.
void pack_fp4_expert(const MmaPackShape& s, const uint8_t* raw, int64_t e, uint32_t* dst_e) {
  uint32_t spread[4][256];  // [pair j][byte: first code low nibble, second high]
  for (int j = 0; j < 4; ++j) {
    for (unsigned v = 0; v < 256; ++v) {
      uint32_t w = 0;
      for (int half = 0; half < 2; ++half) {
        const unsigned code = (v >> (4 * half)) & 15u;
        for (int i = 0; i < 4; ++i) {
          w |= ((code >> i) & 1u) << mma_fp4_bit(s.fp4_mag_bit, j, half, i);
        }
      }
      spread[j][v] = w;
    }
  }
  for_each_lane_step(
      s, raw, e, s.k / 2, dst_e,
      [&](uint32_t* words, int st, int64_t k0, const uint8_t* ra, const uint8_t* rb) {
        if (k0 < 0) return;  // zeroed: +0
        const int64_t at = k0 / 2;
        if (ra != nullptr) words[st] |= spread[0][ra[at]] | spread[2][ra[at + 1]];
        if (rb != nullptr) words[st] |= spread[1][rb[at]] | spread[3][rb[at + 1]];
      });
}

// FP8: expert e's e4m3 codes into dst_e in the FP8 bit layout (mma_fp8_bit); padding +0. Pair j of
// a step (rows g + 8 (j & 1), k0 + 2 (j >> 1) + {0, 1}) is pair jj = j & 1 of word 2 st + j / 2,
// each code spread to its bits by a table.
void pack_fp8_expert(const MmaPackShape& s, const uint8_t* raw, const uint8_t* raw_linear,
                     int64_t e, uint32_t* dst_e) {
  uint32_t spread[2][2][256];  // [pair jj][half][code]
  for (int jj = 0; jj < 2; ++jj) {
    for (int half = 0; half < 2; ++half) {
      for (unsigned v = 0; v < 256; ++v) {
        uint32_t w = 0;
        for (int i = 0; i < 8; ++i) {
          w |= ((v >> i) & 1u) << mma_fp8_bit(s.fp8_mag_bit, jj, half, i);
        }
        spread[jj][half][v] = w;
      }
    }
  }
  for_each_lane_step(
      s, raw, e, s.k, dst_e,
      [&](uint32_t* words, int st, int64_t k0, const uint8_t* ra, const uint8_t* rb) {
        if (k0 < 0) return;  // zeroed: +0
        for (int jj = 0; jj < 2; ++jj) {
          const uint8_t* row = jj ? rb : ra;
          if (row == nullptr) continue;
          for (int j2 = 0; j2 < 2; ++j2) {  // j = jj + 2 j2: k0 + 2 j2 + {0, 1}
            words[2 * st + j2] |=
                spread[jj][0][row[k0 + 2 * j2]] | spread[jj][1][row[k0 + 2 * j2 + 1]];
          }
        }
      },
      raw_linear);
}

// Runs pack(e) for every expert, over every core: experts are independent and write disjoint
// ranges (a layer's prepare otherwise spends seconds here).
template <typename F>
void for_experts_in_parallel(int64_t experts, F&& pack) {
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(experts, static_cast<int64_t>(std::thread::hardware_concurrency())));
  run_parts(threads, [&](int64_t w) {
    for (int64_t e = w; e < experts; e += threads) pack(e);
  });
}

}  // namespace

void mma_pack_fp4(const MmaPackShape& s, const uint8_t* raw, int64_t experts,
                  std::vector<uint32_t>* out) {
  out->assign(static_cast<size_t>(experts * s.words_per_expert()), 0u);
  for_experts_in_parallel(experts, [&](int64_t e) {
    pack_fp4_expert(s, raw, e, out->data() + e * s.words_per_expert());
  });
}

void mma_pack_fp8(const MmaPackShape& s, const uint8_t* raw, int64_t experts,
                  std::vector<uint32_t>* out, const uint8_t* raw_linear) {
  out->assign(static_cast<size_t>(experts * s.words_per_expert()), 0u);
  for_experts_in_parallel(experts, [&](int64_t e) {
    pack_fp8_expert(s, raw, raw_linear, e, out->data() + e * s.words_per_expert());
  });
}

float nvfp4_multiplier(uint8_t e4m3, bool bf16) {
  return num::e4m3_to_f32(e4m3) * nvfp4_mult_factor(bf16);  // exact: a power of two
}

void mma_pack_int(const MmaPackShape& s, const uint8_t* raw, int64_t experts,
                  std::vector<uint32_t>* out) {
  out->assign(static_cast<size_t>(experts * s.words_per_expert()), 0u);
  for_experts_in_parallel(
      experts, [&](int64_t e) { pack_expert(s, raw, e, out->data() + e * s.words_per_expert()); });
}

void mma_gated_row_scales(const MmaPackShape& s, const uint8_t* gate, const uint8_t* linear,
                          int elem_bytes, int64_t block_rows, int64_t experts,
                          std::vector<uint8_t>* out) {
  const int64_t inter = s.units, nbk = s.k_blocks();
  const int64_t nbn = (inter + block_rows - 1) / block_rows;
  out->resize(static_cast<size_t>(experts * 2 * inter * nbk * elem_bytes));
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < 2 * inter; ++r) {
      const uint8_t* src = r < inter ? gate : linear;
      const int64_t lr = r % inter;
      for (int64_t b = 0; b < nbk; ++b) {
        const uint8_t* from = src + ((e * nbn + lr / block_rows) * nbk + b) * elem_bytes;
        std::copy(from, from + elem_bytes,
                  out->data() + ((e * 2 * inter + r) * nbk + b) * elem_bytes);
      }
    }
  }
}

unsigned mma_packed_code(const MmaPackShape& s, const uint32_t* packed, int64_t e, int64_t pr,
                         int64_t k) {
  const int b = s.bits, sc = s.steps_per_chunk;
  const int64_t m = pr / 16, r = pr % 16;
  const int64_t step = k / 16, kk = k % 16;
  const int64_t c = step / sc;
  // Lane (g, t)'s pair j, half h holds row g + 8 (j & 1), kk = 4 t + 2 (j >> 1) + h (mma_pack.h).
  const int g = static_cast<int>(r % 8), t = static_cast<int>(kk / 4);
  const int j = static_cast<int>((r >= 8 ? 1 : 0) + 2 * ((kk % 4) / 2));
  const int half = static_cast<int>(kk % 2);
  const int lane = 4 * g + t;
  const int pair = static_cast<int>(4 * (step % sc)) + j;
  const uint32_t* chunk = packed + e * s.words_per_expert() + (m * s.chunks + c) * 128;
  if (mma_step_major(s.codes, b)) {  // natural K: kk = 2 t + 8 (j >> 1) + h; top bit flipped
    const int t2 = static_cast<int>((kk % 8) / 2);
    const int j2 = static_cast<int>((r >= 8 ? 1 : 0) + 2 * (kk / 8));
    const Slot sl = slot_of(b, static_cast<int>(4 * (step % sc)) + j2, half);
    const uint32_t word = chunk[mma_chunk_word(b, 4 * g + t2, sl.word)];
    return ((word >> sl.bit) & ((1u << b) - 1u)) ^ (1u << (b - 1));
  }
  chunk += lane * 4;
  if (s.codes == MmaCodes::kFp8)
    return mma_fp8_code(chunk[pair / 2], s.fp8_mag_bit, pair % 2, half);
  if (s.codes != MmaCodes::kInt)
    return mma_fp4_code(chunk[pair / 4], s.fp4_mag_bit, pair % 4, half);
  const Slot sl = slot_of(b, pair, half);
  return (chunk[sl.word] >> sl.bit) & ((1u << b) - 1u);
}

}  // namespace qmoe

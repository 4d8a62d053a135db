// The decode kernels' fragment layout holds every code exactly once, at the position mma_pack.h
// documents, for every width, row map and K (padding included).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/formats/codec.h"
#include "core/formats/mma_pack.h"
#include "layer_factory.h"

namespace qmoe::test {
namespace {

void check_roundtrip(WeightFormat wf, int64_t n, int64_t k, MmaRowMap map, int64_t inter) {
  SCOPED_TRACE(std::string(format_info(wf).name) + " n " + std::to_string(n) + " k " +
               std::to_string(k) + " map " + std::to_string(static_cast<int>(map)));
  const int64_t experts = 3;
  QuantizedFc q;
  FcFormat f = default_fc_format(wf);
  f.block_size = 16;
  make_fc(f, experts, n, k, fresh_seed(), &q);
  if (::testing::Test::HasFatalFailure()) return;
  const MmaPackShape s = mma_pack_shape(f, n, k, map, inter);
  std::vector<uint32_t> packed;
  mma_pack_int(s, q.weight.data(), experts, &packed);
  ASSERT_EQ(packed.size(), static_cast<size_t>(experts * s.words_per_expert()));
  const int b = f.bits();
  const int64_t row_bytes = formats::packed_bytes(k, b);
  std::vector<int> seen(static_cast<size_t>(n), 0);
  const int64_t kpad = s.chunks * 16 * s.steps_per_chunk;
  for (int64_t e = 0; e < experts; ++e) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int64_t pr = 0; pr < s.tiles * 16; ++pr) {
      const int64_t lr = s.logical_row(pr);
      if (lr >= 0) ++seen[static_cast<size_t>(lr)];
      for (int64_t kk = 0; kk < kpad; ++kk) {
        const unsigned want =
            (lr >= 0 && kk < k)
                ? formats::read_bits(q.weight.data() + (e * n + lr) * row_bytes, kk, b)
                : 1u << (b - 1);
        ASSERT_EQ(mma_packed_code(s, packed.data(), e, pr, kk), want)
            << "expert " << e << " packed row " << pr << " k " << kk;
      }
    }
    for (int64_t r = 0; r < n; ++r) ASSERT_EQ(seen[static_cast<size_t>(r)], 1) << "row " << r;
  }
}

TEST(MmaPack, EveryWidthAndRowMap) {
  for (WeightFormat wf :
       {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kInt4, WeightFormat::kInt8}) {
    check_roundtrip(wf, 48, 128, MmaRowMap::kIdentity, 0);
    check_roundtrip(wf, 40, 96, MmaRowMap::kIdentity, 0);  // a partial tile and a partial chunk
    check_roundtrip(wf, 2 * 24, 64, MmaRowMap::kGatedInterleaved, 24);
    check_roundtrip(wf, 2 * 20, 80, MmaRowMap::kGatedConcatenated, 20);  // a partial unit group
  }
}

// Every scale and zero point of the tile-ordered copies equals the ORT tensors' entry of its
// logical row and block, bit for bit; padding rows and blocks hold 0 and the symmetric point.
void check_scales(WeightFormat wf, int block, int64_t n, int64_t k, MmaRowMap map, int64_t inter,
                  DType scale_dtype) {
  SCOPED_TRACE(std::string(format_info(wf).name) + " block " + std::to_string(block) + " n " +
               std::to_string(n) + " k " + std::to_string(k));
  const int64_t experts = 2;
  FcFormat f = default_fc_format(wf);
  f.block_size = block;
  f.zero_points = true;
  f.scale_dtype = scale_dtype;
  QuantizedFc q;
  make_fc(f, experts, n, k, fresh_seed(), &q);
  if (::testing::Test::HasFatalFailure()) return;
  const MmaPackShape s = mma_pack_shape(f, n, k, map, inter);
  const int64_t kpad = s.chunks * 16 * s.steps_per_chunk;
  ASSERT_EQ(s.scale_blocks, block ? (kpad + block - 1) / block : 1);
  const int eb = static_cast<int>(dtype_size(scale_dtype));
  std::vector<uint8_t> sc, zp;
  mma_pack_scales(s, q.scales.data(), eb, experts, &sc);
  mma_pack_zero_points(s, q.zero_points.data(), experts, &zp);
  ASSERT_EQ(sc.size(), static_cast<size_t>(experts * s.tiles * 16 * s.scale_blocks * eb));
  ASSERT_EQ(zp.size(), static_cast<size_t>(experts * s.tiles * 16 * s.scale_blocks));
  const int64_t nblk = block ? k / block : 1;
  const int b = f.bits();
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t pr = 0; pr < s.tiles * 16; ++pr) {
      const int64_t lr = s.logical_row(pr);
      for (int64_t bl = 0; bl < s.scale_blocks; ++bl) {
        const int64_t i = mma_scale_index(s, e, pr, bl);
        const bool real = lr >= 0 && bl < nblk;
        for (int by = 0; by < eb; ++by) {
          const uint8_t want = real ? q.scales[((e * n + lr) * nblk + bl) * eb + by] : 0;
          ASSERT_EQ(sc[i * eb + by], want) << "expert " << e << " row " << pr << " block " << bl;
        }
        unsigned zwant = 1u << (b - 1);
        if (real) {
          zwant = block ? formats::read_bits(
                              q.zero_points.data() + (e * n + lr) * formats::packed_bytes(nblk, b),
                              bl, b)
                        : formats::read_bits(q.zero_points.data() + e * formats::packed_bytes(n, b),
                                             lr, b);
        }
        ASSERT_EQ(zp[i], zwant) << "expert " << e << " row " << pr << " block " << bl;
      }
    }
  }
}

TEST(MmaPack, ScalesAndZeroPointsInTileOrder) {
  check_scales(WeightFormat::kInt4, 128, 48, 256, MmaRowMap::kIdentity, 0, DType::kBF16);
  check_scales(WeightFormat::kInt4, 0, 40, 96, MmaRowMap::kIdentity, 0, DType::kF32);
  check_scales(WeightFormat::kInt2, 64, 2 * 20, 192, MmaRowMap::kGatedConcatenated, 20,
               DType::kF16);
  check_scales(WeightFormat::kInt8, 16, 2 * 24, 64, MmaRowMap::kGatedInterleaved, 24, DType::kBF16);
  check_scales(WeightFormat::kInt3, 32, 24, 160, MmaRowMap::kIdentity, 0, DType::kF32);
  check_scales(WeightFormat::kInt4, 0, 2 * 12, 64, MmaRowMap::kGatedInterleaved, 12, DType::kF16);
}

TEST(MmaPack, SupportedFormats) {
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kInt4), 2048));
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kInt3), 2048));
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kNvFp4), 2048));
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kMxFp4), 2880));
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kFp8), 2048));
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kFp8Block), 7168));
  EXPECT_TRUE(mma_pack_supported(default_fc_format(WeightFormat::kFp8Block), 2880));
  FcFormat fb = default_fc_format(WeightFormat::kFp8Block);
  fb.block_size = 16;  // blocks shorter than a 32-K chunk
  EXPECT_FALSE(mma_pack_supported(fb, 2048));
  fb.block_size = 96;  // not a power of two
  EXPECT_FALSE(mma_pack_supported(fb, 2048));
  EXPECT_FALSE(mma_pack_supported(default_fc_format(WeightFormat::kFp8), 200));
  FcFormat f = default_fc_format(WeightFormat::kInt8);
  f.block_size = 0;
  EXPECT_TRUE(mma_pack_supported(f, 768));
  EXPECT_FALSE(mma_pack_supported(f, 200));  // K not a multiple of 16
  f.block_size = 48;                         // scale blocks must be powers of two
  EXPECT_FALSE(mma_pack_supported(f, 768));
}

// FP4 and FP8: every code once at its documented place (K-packed E2M1 or e4m3 bytes, both bit
// layouts, both formats of each, row maps, partial tiles and chunks), padding +0.
void check_float_roundtrip(WeightFormat wf, DType act, int64_t n, int64_t k, MmaRowMap map,
                           int64_t inter) {
  SCOPED_TRACE(std::string(format_info(wf).name) + " " + dtype_name(act) + " n " +
               std::to_string(n) + " k " + std::to_string(k));
  const int64_t experts = 2;
  QuantizedFc q;
  const FcFormat f = default_fc_format(wf);
  make_fc(f, experts, n, k, fresh_seed(), &q);
  if (::testing::Test::HasFatalFailure()) return;
  const MmaPackShape s = mma_pack_shape(f, n, k, map, inter, act);
  const bool fp8 = f.info().kind == FormatKind::kFp8;
  const bool bf16 = act == DType::kBF16;
  if (fp8) {
    ASSERT_EQ(s.codes, MmaCodes::kFp8);
    ASSERT_EQ(s.fp8_mag_bit, bf16 ? 4 : 7);
    ASSERT_EQ(s.steps_per_chunk, 2);
  } else {
    ASSERT_EQ(s.fp4_mag_bit, bf16 ? 6 : 9);
  }
  std::vector<uint32_t> packed;
  if (fp8) {
    mma_pack_fp8(s, q.weight.data(), experts, &packed);
  } else {
    mma_pack_fp4(s, q.weight.data(), experts, &packed);
  }
  ASSERT_EQ(packed.size(), static_cast<size_t>(experts * s.words_per_expert()));
  const int64_t kpad = s.chunks * 16 * s.steps_per_chunk;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t pr = 0; pr < s.tiles * 16; ++pr) {
      const int64_t lr = s.logical_row(pr);
      for (int64_t kk = 0; kk < kpad; ++kk) {
        unsigned want = 0;
        if (lr >= 0 && kk < k) {
          want = fp8 ? q.weight[(e * n + lr) * k + kk]
                     : (q.weight[(e * n + lr) * (k / 2) + kk / 2] >> (4 * (kk & 1))) & 15u;
        }
        ASSERT_EQ(mma_packed_code(s, packed.data(), e, pr, kk), want)
            << "expert " << e << " packed row " << pr << " k " << kk;
      }
    }
  }
}

TEST(MmaPack, FloatCodesEveryLayoutAndRowMap) {
  for (WeightFormat wf :
       {WeightFormat::kNvFp4, WeightFormat::kMxFp4, WeightFormat::kFp8, WeightFormat::kFp8Block}) {
    for (DType act : {DType::kBF16, DType::kF16}) {
      check_float_roundtrip(wf, act, 48, 128, MmaRowMap::kIdentity, 0);
      // A partial tile and chunk (FP4 chunks are 64 K, FP8 chunks 32; MXFP4 needs K % 32 == 0).
      const int64_t odd_k = format_info(wf).kind == FormatKind::kFp8 ? 80 : 96;
      check_float_roundtrip(wf, act, 40, odd_k, MmaRowMap::kIdentity, 0);
      check_float_roundtrip(wf, act, 2 * 24, 64, MmaRowMap::kGatedInterleaved, 24);
      check_float_roundtrip(wf, act, 2 * 20, 160, MmaRowMap::kGatedConcatenated, 20);
    }
  }
}

uint32_t rotr(uint32_t w, int r) { return r == 0 ? w : (w >> r) | (w << (32 - r)); }

// The kernel's decode of pair j of a word (decode_common.cuh, fp4_pair): the magnitudes rotated
// right by 3 j, the signs by P - 3 + j, masked, as two halves of the layout's type.
void decode_pair(uint32_t w, int mag_bit, int j, uint16_t* lo, uint16_t* hi) {
  const uint32_t mag = rotr(w, 3 * j) & ((7u << mag_bit) | (7u << (mag_bit + 16)));
  const uint32_t v = (rotr(w, mag_bit - 3 + j) & 0x80008000u) | mag;
  *lo = static_cast<uint16_t>(v);
  *hi = static_cast<uint16_t>(v >> 16);
}

double half_value(uint16_t h, bool bf16) { return bf16 ? num::bf16_to_f32(h) : num::f16_to_f32(h); }

// The bit layout fills a word exactly, and each pair decodes to the E2M1 values times 2^-126
// (bf16) or 2^-14 (f16), whatever the other pairs hold: every code in every slot.
TEST(MmaPack, Fp4PairsDecodeExactly) {
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed()));
  for (bool bf16 : {true, false}) {
    const int p = bf16 ? 6 : 9;
    const double unit = bf16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -14);
    uint32_t all = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        for (int i = 0; i < 4; ++i) {
          const uint32_t bit = 1u << mma_fp4_bit(p, j, half, i);
          ASSERT_EQ(all & bit, 0u) << "two codes share bit " << mma_fp4_bit(p, j, half, i);
          all |= bit;
        }
      }
    }
    ASSERT_EQ(all, 0xFFFFFFFFu);
    for (int j = 0; j < 4; ++j) {
      for (unsigned a = 0; a < 16; ++a) {
        for (unsigned b = 0; b < 16; ++b) {
          uint32_t w = rng();
          for (int i = 0; i < 4; ++i) {  // pair j's codes over random neighbours
            for (int half = 0; half < 2; ++half) {
              const uint32_t bit = 1u << mma_fp4_bit(p, j, half, i);
              const unsigned code = half ? b : a;
              w = ((code >> i) & 1u) ? (w | bit) : (w & ~bit);
            }
          }
          uint16_t lo, hi;
          decode_pair(w, p, j, &lo, &hi);
          ASSERT_EQ(half_value(lo, bf16), num::e2m1_to_f32(static_cast<uint8_t>(a)) * unit)
              << "pair " << j << " code " << a;
          ASSERT_EQ(half_value(hi, bf16), num::e2m1_to_f32(static_cast<uint8_t>(b)) * unit)
              << "pair " << j << " code " << b;
        }
      }
    }
  }
}

// NVFP4's multipliers: for every finite e4m3 scale and every code, the decoded half times the
// scale's multiplier, rounded to the type (what the kernel's HMUL2 gives), is E2M1 * scale * 2^-c
// exactly, and the multiplier itself is a value of the type.
TEST(MmaPack, NvFp4MultipliersAreExact) {
  for (bool bf16 : {true, false}) {
    const int c = nvfp4_mult_shift(bf16);
    const double unit = bf16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -14);
    for (int code = 0; code < 256; ++code) {
      const double sv = num::e4m3_to_f32(static_cast<uint8_t>(code));
      if (std::isnan(sv)) continue;
      const float m = nvfp4_multiplier(static_cast<uint8_t>(code), bf16);
      const uint16_t mh = bf16 ? num::f32_to_bf16(m) : num::f32_to_f16(m);
      ASSERT_EQ(half_value(mh, bf16), static_cast<double>(m)) << "e4m3 " << code;
      for (unsigned q = 0; q < 16; ++q) {
        const double want = num::e2m1_to_f32(static_cast<uint8_t>(q)) * sv * std::ldexp(1.0, -c);
        const double prod = num::e2m1_to_f32(static_cast<uint8_t>(q)) * unit * m;
        const float pf = static_cast<float>(prod);
        ASSERT_EQ(static_cast<double>(pf), prod) << "the product is not an fp32 value";
        const double rounded = half_value(bf16 ? num::f32_to_bf16(pf) : num::f32_to_f16(pf), bf16);
        ASSERT_EQ(rounded, want) << (bf16 ? "bf16" : "f16") << " e4m3 " << code << " e2m1 " << q;
      }
    }
  }
}

// The FP8 bit layout fills a word exactly, and each pair, decoded with the kernel's arithmetic
// (mma_fp8_pair_bits), gives every e4m3 value times 2^-8 (f16) or 2^-120 (bf16) exactly, whatever
// the other pair holds: all 256 x 256 code pairs in both slots, subnormals and zeros included.
// bf16 then takes an HMUL2 by 2^120, exact for every code (a product of at most 4 significant
// bits inside bf16's range); f16's sums take 2^kFp8F16Shift in fp32.
TEST(MmaPack, Fp8PairsDecodeExactly) {
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed()));
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f16");
    const int p = bf16 ? 4 : 7;
    const double unit = std::ldexp(1.0, bf16 ? -120 : -kFp8F16Shift);
    uint32_t all = 0;
    for (int jj = 0; jj < 2; ++jj) {
      for (int half = 0; half < 2; ++half) {
        for (int i = 0; i < 8; ++i) {
          const uint32_t bit = 1u << mma_fp8_bit(p, jj, half, i);
          ASSERT_EQ(all & bit, 0u) << "two codes share bit " << mma_fp8_bit(p, jj, half, i);
          all |= bit;
        }
      }
    }
    ASSERT_EQ(all, 0xFFFFFFFFu);
    int subnormal_halves = 0;
    for (int jj = 0; jj < 2; ++jj) {
      for (unsigned a = 0; a < 256; ++a) {
        for (unsigned b = 0; b < 256; ++b) {
          const double va = num::e4m3_to_f32(static_cast<uint8_t>(a));
          const double vb = num::e4m3_to_f32(static_cast<uint8_t>(b));
          if (std::isnan(va) || std::isnan(vb)) continue;  // 0x7F, 0xFF: no weight holds them
          uint32_t w = rng();
          for (int i = 0; i < 8; ++i) {  // pair jj's codes over a random neighbour
            for (int half = 0; half < 2; ++half) {
              const uint32_t bit = 1u << mma_fp8_bit(p, jj, half, i);
              w = (((half ? b : a) >> i) & 1u) ? (w | bit) : (w & ~bit);
            }
          }
          ASSERT_EQ(mma_fp8_code(w, p, jj, 0), a);
          ASSERT_EQ(mma_fp8_code(w, p, jj, 1), b);
          const uint32_t v = mma_fp8_pair_bits(w, p, jj);
          const uint16_t lo = static_cast<uint16_t>(v), hi = static_cast<uint16_t>(v >> 16);
          if ((lo & (bf16 ? 0x7F80u : 0x7C00u)) == 0 && (lo & 0x7FFFu) != 0) ++subnormal_halves;
          ASSERT_EQ(half_value(lo, bf16), va * unit) << "pair " << jj << " code " << a;
          ASSERT_EQ(half_value(hi, bf16), vb * unit) << "pair " << jj << " code " << b;
          if (bf16) {  // the HMUL2 by 2^120: the product is a bf16 value, so rounding keeps it
            const float prod = static_cast<float>(half_value(lo, true) * std::ldexp(1.0, 120));
            ASSERT_EQ(static_cast<double>(prod), va);
            ASSERT_EQ(half_value(num::f32_to_bf16(prod), true), va) << "code " << a;
          }
        }
      }
    }
    // bf16: e4m3's subnormals land below 2^-126; f16: every code below 2^-6 lands below 2^-14.
    EXPECT_GT(subnormal_halves, 0);
  }
}

// fp8_block's square scale blocks in tile order: one entry per packed row and K block, the source
// block of the row's block of rows (scale_rows), partial edge blocks in both directions.
void check_fp8_block_scales(int block, int64_t n, int64_t k, MmaRowMap map, int64_t inter,
                            DType scale_dtype) {
  SCOPED_TRACE("fp8_block b" + std::to_string(block) + " n " + std::to_string(n) + " k " +
               std::to_string(k));
  const int64_t experts = 2;
  FcFormat f = default_fc_format(WeightFormat::kFp8Block);
  f.block_size = block;
  f.scale_dtype = scale_dtype;
  QuantizedFc q;
  make_fc(f, experts, n, k, fresh_seed(), &q);
  if (::testing::Test::HasFatalFailure()) return;
  const MmaPackShape s = mma_pack_shape(f, n, k, map, inter, DType::kBF16);
  ASSERT_EQ(s.block_size, block);
  ASSERT_EQ(s.scale_rows, block);
  ASSERT_EQ(s.scale_blocks, (s.chunks * 32 + block - 1) / block);
  const int eb = static_cast<int>(dtype_size(scale_dtype));
  std::vector<uint8_t> sc;
  mma_pack_scales(s, q.scales.data(), eb, experts, &sc);
  ASSERT_EQ(sc.size(), static_cast<size_t>(experts * s.tiles * 16 * s.scale_blocks * eb));
  const int64_t nbk = (k + block - 1) / block, nbn = (n + block - 1) / block;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t pr = 0; pr < s.tiles * 16; ++pr) {
      const int64_t lr = s.logical_row(pr);
      for (int64_t bl = 0; bl < s.scale_blocks; ++bl) {
        const int64_t i = mma_scale_index(s, e, pr, bl);
        const bool real = lr >= 0 && bl < nbk;
        for (int by = 0; by < eb; ++by) {
          const uint8_t want =
              real ? q.scales[((e * nbn + lr / block) * nbk + bl) * eb + by] : uint8_t{0};
          ASSERT_EQ(sc[i * eb + by], want) << "expert " << e << " row " << pr << " block " << bl;
        }
      }
    }
  }
}

TEST(MmaPack, Fp8BlockScalesInTileOrder) {
  check_fp8_block_scales(128, 136, 160, MmaRowMap::kIdentity, 0, DType::kF32);
  check_fp8_block_scales(32, 2 * 40, 80, MmaRowMap::kGatedConcatenated, 40, DType::kBF16);
  check_fp8_block_scales(32, 2 * 40, 96, MmaRowMap::kGatedInterleaved, 40, DType::kF16);
}

// FC1 and a separate FC3 as one FC: every row's scales are its own FC's (gate rows 0..I-1 from
// FC1, linear rows I..2I-1 from FC3), for fp8_block's blocks of rows (I not a multiple of the
// block) and fp8's global scales.
TEST(MmaPack, GatedRowScalesFromTwoFcs) {
  for (WeightFormat wf : {WeightFormat::kFp8Block, WeightFormat::kFp8}) {
    SCOPED_TRACE(format_info(wf).name);
    const int64_t experts = 2, inter = 40, k = 96;
    FcFormat f = default_fc_format(wf);
    if (wf == WeightFormat::kFp8Block) {
      f.block_size = 32;
      f.scale_dtype = DType::kBF16;
    }
    QuantizedFc gate, lin;
    make_fc(f, experts, inter, k, fresh_seed(), &gate);
    make_fc(f, experts, inter, k, fresh_seed(), &lin);
    if (::testing::Test::HasFatalFailure()) return;
    const bool block = wf == WeightFormat::kFp8Block;
    const MmaPackShape s =
        mma_pack_shape(f, 2 * inter, k, MmaRowMap::kGatedConcatenated, inter, DType::kBF16);
    const int eb = block ? 2 : 4;
    auto bytes = [&](const QuantizedFc& q) {
      return block ? q.scales.data() : reinterpret_cast<const uint8_t*>(q.global_scale.data());
    };
    std::vector<uint8_t> rows;
    mma_gated_row_scales(s, bytes(gate), bytes(lin), eb, block ? 32 : inter, experts, &rows);
    const int64_t nbk = s.k_blocks(), nbn = block ? (inter + 31) / 32 : 1;
    ASSERT_EQ(nbk, block ? 3 : 1);
    ASSERT_EQ(rows.size(), static_cast<size_t>(experts * 2 * inter * nbk * eb));
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t r = 0; r < 2 * inter; ++r) {
        const QuantizedFc& q = r < inter ? gate : lin;
        const int64_t lr = r % inter;
        for (int64_t b = 0; b < nbk; ++b) {
          const int64_t from = block ? (e * nbn + lr / 32) * nbk + b : e;
          for (int by = 0; by < eb; ++by) {
            ASSERT_EQ(rows[static_cast<size_t>(((e * 2 * inter + r) * nbk + b) * eb + by)],
                      bytes(q)[from * eb + by])
                << "expert " << e << " row " << r << " block " << b;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace qmoe::test

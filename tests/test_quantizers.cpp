// Weight formats, continued: the quantizers against the documented formulas, the exactness of the
// float dequantizer against the fp64 one, error budgets, and the fp4 repacking. The format list
// and the shared helpers are in format_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "format_test_util.h"
#include "qmoe/format.h"
#include "qmoe/quantize.h"
#include "test_util.h"

namespace qmoe {
namespace {

using namespace format_test;

// Code idx of an LSB-first bitstream, read one bit at a time (independent of the library's reader).
unsigned bits_at(const uint8_t* p, int64_t idx, int bits) {
  unsigned v = 0;
  for (int t = 0; t < bits; ++t) {
    const int64_t j = idx * bits + t;
    v |= ((p[j / 8] >> (j % 8)) & 1u) << t;
  }
  return v;
}

std::vector<float> dequantize_all(const QuantizedFc& q) {
  std::vector<float> out(static_cast<size_t>(q.experts * q.n * q.k));
  const Status st = dequantize_fc(q.format, q.view(), q.experts, q.n, q.k, out.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

// ---- quantizers against the documented formulas (docs/formats.md) ----

TEST(Quantizers, IntegerFollowTheFormulas) {
  const int64_t e = 2, n = 3, k = 256;
  const std::vector<float> w = test::gaussian(e * n * k, test::fresh_seed());
  for (const FcFormat& f : all_configs()) {
    if (f.info().kind != FormatKind::kInteger) continue;
    const QuantizedFc q = quantize_or_die(f, w, e, n, k);
    const int bits = f.bits(), half = 1 << (bits - 1), qmax = (1 << bits) - 1;
    const int64_t bs = f.block_size ? f.block_size : k, nb = k / bs;
    const int64_t row_bytes = (k * bits + 7) / 8;
    for (int64_t x = 0; x < e; ++x) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
          const float* v = &w[(x * n + r) * k + b * bs];
          float amax = 0, lo = 0, hi = 0;
          for (int64_t i = 0; i < bs; ++i) {
            amax = std::max(amax, std::fabs(v[i]));
            lo = std::min(lo, v[i]);
            hi = std::max(hi, v[i]);
          }
          const float s =
              round_to(f.scale_dtype, f.zero_points ? (hi - lo) / qmax : amax / (half - 0.5f));
          ASSERT_EQ(scale_at(q, (x * n + r) * nb + b), s) << f.to_string();
          int zp = half;
          if (f.zero_points) {
            zp = std::min(std::max(static_cast<int>(std::round(-lo / s)), 0), qmax);
            const unsigned got =
                f.block_size
                    ? bits_at(q.zero_points.data() + (x * n + r) * ((nb * bits + 7) / 8), b, bits)
                    : bits_at(q.zero_points.data() + x * ((n * bits + 7) / 8), r, bits);
            ASSERT_EQ(got, static_cast<unsigned>(zp)) << f.to_string();
          }
          for (int64_t i = 0; i < bs; ++i) {
            const int rq = static_cast<int>(std::round(v[i] / s));
            const int want = f.zero_points ? std::min(std::max(rq + zp, 0), qmax)
                                           : std::min(std::max(rq, -half), half - 1) + half;
            const unsigned got =
                bits_at(q.weight.data() + (x * n + r) * row_bytes, b * bs + i, bits);
            ASSERT_EQ(got, static_cast<unsigned>(want)) << f.to_string() << " i " << i;
          }
        }
      }
    }
  }
}

TEST(Quantizers, Fp4FollowTheFormulas) {
  const int64_t e = 2, n = 4, k = 128;
  std::vector<float> w = test::gaussian(e * n * k, test::fresh_seed());
  for (float& v : w) v *= 3.0f;
  for (WeightFormat wf : {WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    const FcFormat f = default_fc_format(wf);
    const QuantizedFc q = quantize_or_die(f, w, e, n, k);
    const int bs = f.block_size;
    for (int64_t x = 0; x < e; ++x) {
      float emax = 0;
      for (int64_t i = 0; i < n * k; ++i) emax = std::max(emax, std::fabs(w[x * n * k + i]));
      const float g = wf == WeightFormat::kNvFp4 ? emax / (6.0f * 448.0f) : 1.0f;
      ASSERT_EQ(q.global_scale[x], g);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t b = 0; b < k / bs; ++b) {
          const float* v = &w[(x * n + r) * k + b * bs];
          float amax = 0;
          for (int i = 0; i < bs; ++i) amax = std::max(amax, std::fabs(v[i]));
          uint8_t sc;
          if (wf == WeightFormat::kNvFp4) {
            sc = num::f32_to_e4m3(amax / 6.0f / g);
          } else {
            sc = static_cast<uint8_t>(127 + std::lround(std::log2(amax / 6.0)));
          }
          ASSERT_EQ(q.scales[(x * n + r) * (k / bs) + b], sc) << f.to_string();
          const float denom =
              wf == WeightFormat::kNvFp4 ? num::e4m3_to_f32(sc) * g : num::e8m0_to_f32(sc);
          for (int i = 0; i < bs; ++i) {
            const int64_t kk = b * bs + i;
            const unsigned got = (q.weight[(x * n + r) * (k / 2) + kk / 2] >> (4 * (kk & 1))) & 15u;
            ASSERT_EQ(got, num::f32_to_e2m1(v[i] / denom)) << f.to_string();
          }
        }
      }
    }
  }
}

TEST(Quantizers, Fp8FollowTheFormulas) {
  const int64_t e = 2, n = 5, k = 33;
  const std::vector<float> w = test::gaussian(e * n * k, test::fresh_seed());
  const QuantizedFc q = quantize_or_die(default_fc_format(WeightFormat::kFp8), w, e, n, k);
  for (int64_t x = 0; x < e; ++x) {
    float amax = 0;
    for (int64_t i = 0; i < n * k; ++i) amax = std::max(amax, std::fabs(w[x * n * k + i]));
    ASSERT_EQ(q.global_scale[x], amax / 448.0f);
    for (int64_t i = 0; i < n * k; ++i) {
      ASSERT_EQ(q.weight[x * n * k + i], num::f32_to_e4m3(w[x * n * k + i] / (amax / 448.0f)));
    }
  }
  const int64_t bs = 4;  // ceil(5 / 4) x ceil(33 / 4) = 2 x 9 blocks, the last ones partial
  const QuantizedFc qb =
      quantize_or_die(make_format(WeightFormat::kFp8Block, bs, false, DType::kF16), w, e, n, k);
  for (int64_t x = 0; x < e; ++x) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const float s = scale_at(qb, (x * 2 + r / bs) * 9 + c / bs);
        ASSERT_EQ(qb.weight[(x * n + r) * k + c], num::f32_to_e4m3(w[(x * n + r) * k + c] / s));
      }
    }
  }
}

TEST(Quantizers, ZeroWeightsGiveZerosAndTheDocumentedScales) {
  const int64_t e = 2, n = 4, k = 256;
  const std::vector<float> w(e * n * k, 0.0f);
  for (const FcFormat& f : all_configs()) {
    const QuantizedFc q = quantize_or_die(f, w, e, n, k);
    for (float v : dequantize_all(q)) ASSERT_EQ(v, 0.0f) << f.to_string();
    const FormatInfo& fi = f.info();
    if (fi.kind == FormatKind::kInteger) {  // scale 0, every code and zero point 2^(bits-1)
      for (int64_t i = 0; i < static_cast<int64_t>(q.scales.size() / dtype_size(f.scale_dtype));
           ++i) {
        ASSERT_EQ(scale_at(q, i), 0.0f);
      }
      ASSERT_EQ(bits_at(q.weight.data(), 5, f.bits()), 1u << (f.bits() - 1));
      if (f.zero_points) {
        ASSERT_EQ(bits_at(q.zero_points.data(), 0, f.bits()), 1u << (f.bits() - 1));
      }
    } else if (f.format == WeightFormat::kMxFp4) {
      for (uint8_t c : q.scales) ASSERT_EQ(c, 127);
    } else if (f.format == WeightFormat::kNvFp4 || f.format == WeightFormat::kFp8) {
      for (float g : q.global_scale) ASSERT_EQ(g, 1.0f);
    } else {
      for (size_t i = 0; i < q.scales.size() / dtype_size(f.scale_dtype); ++i) {
        ASSERT_EQ(scale_at(q, static_cast<int64_t>(i)), 1.0f);
      }
    }
  }
}

TEST(Quantizers, HugeWeightsSaturateHalfScalesInsteadOfOverflowing) {
  std::vector<float> w = test::gaussian(4 * 64, test::fresh_seed());
  w[3] = 3e6f;  // amax / 7.5 = 4e5 > 65504
  const QuantizedFc q =
      quantize_or_die(make_format(WeightFormat::kInt4, 0, false, DType::kF16), w, 1, 4, 64);
  EXPECT_EQ(scale_at(q, 0), 65504.0f);
  for (float v : dequantize_all(q)) ASSERT_TRUE(std::isfinite(v));
}

TEST(Quantizers, ExpertsAreIndependentAndBuffersReusable) {
  const int64_t e = 3, n = 4, k = 256;
  const std::vector<float> w = test::gaussian(e * n * k, test::fresh_seed());
  const std::vector<float> other = test::gaussian(n * k, test::fresh_seed());
  for (const FcFormat& f : all_configs()) {
    const QuantizedFc whole = quantize_or_die(f, w, e, n, k);
    QuantizedFc q;
    ASSERT_TRUE(allocate_fc(f, e, n, k, &q).is_ok());
    // Expert 1 first receives other weights: none of their bits may survive its own. The experts
    // then go in reverse order.
    ASSERT_TRUE(quantize_expert(other.data(), 1, &q).is_ok());
    for (int64_t x = e - 1; x >= 0; --x) {
      ASSERT_TRUE(quantize_expert(&w[x * n * k], x, &q).is_ok());
    }
    EXPECT_EQ(q.weight, whole.weight) << f.to_string();
    EXPECT_EQ(q.scales, whole.scales) << f.to_string();
    EXPECT_EQ(q.zero_points, whole.zero_points) << f.to_string();
    EXPECT_EQ(q.global_scale, whole.global_scale) << f.to_string();
  }
}

TEST(Quantizers, RejectBadArguments) {
  const FcFormat f = make_format(WeightFormat::kInt4, 128);
  QuantizedFc q;
  Status st = allocate_fc(f, 0, 8, 256, &q);
  EXPECT_EQ(st.message(), "experts: expected >= 1, got 0");
  st = allocate_fc(f, 2, 8, 200, &q);
  EXPECT_EQ(st.message().rfind("fc: block_size 128 does not divide K = 200", 0), 0u)
      << st.message();
  std::vector<float> w = test::gaussian(2 * 8 * 256, test::fresh_seed());
  w[300] = NAN;
  st = quantize_fc(f, w.data(), 2, 8, 256, &q);
  EXPECT_EQ(st.message().rfind("w: non-finite value", 0), 0u) << st.message();
  ASSERT_TRUE(allocate_fc(f, 2, 8, 256, &q).is_ok());
  st = quantize_expert(w.data(), 2, &q);
  EXPECT_EQ(st.message(), "e: expected an expert in [0, 2), got 2");
  st = quantize_expert(nullptr, 0, &q);
  EXPECT_EQ(st.message().rfind("w: ", 0), 0u) << st.message();
  q.scales.pop_back();
  st = quantize_expert(w.data(), 0, &q);
  EXPECT_EQ(st.message().rfind("out: buffers do not match", 0), 0u) << st.message();
}

TEST(Quantizers, DequantizeFcChecksTheTensors) {
  const FcFormat f = make_format(WeightFormat::kInt4, 64);
  const QuantizedFc q =
      quantize_or_die(f, test::gaussian(2 * 8 * 128, test::fresh_seed()), 2, 8, 128);
  FcWeights v = q.view();
  v.scales.dims[2] = 4;
  std::vector<float> out(2 * 8 * 128);
  Status st = dequantize_fc(f, v, 2, 8, 128, out.data());
  EXPECT_EQ(st.message(), "scales: expected f32 [2, 8, 2], got f32 [2, 8, 4]");
  v = q.view();
  v.weight.data = nullptr;
  st = dequantize_fc(f, v, 2, 8, 128, out.data());
  EXPECT_EQ(st.message().rfind("weight: missing", 0), 0u) << st.message();
}

// ---- dequantization: float equals (float) of the exact double, bit for bit ----

void expect_float_is_rounded_double(const FcFormat& f, const FcWeights& w, int64_t e, int64_t n,
                                    int64_t k, const std::string& what) {
  std::vector<float> fo(static_cast<size_t>(k));
  std::vector<double> dou(static_cast<size_t>(k));
  for (int64_t x = 0; x < e; ++x) {
    for (int64_t r = 0; r < n; ++r) {
      dequantize_row<float>(f, w, n, k, x, r, fo.data());
      dequantize_row<double>(f, w, n, k, x, r, dou.data());
      for (int64_t i = 0; i < k; ++i) {
        const float want = static_cast<float>(dou[i]);
        if (std::isnan(want) && std::isnan(fo[i])) continue;
        ASSERT_EQ(num::f32_bits(fo[i]), num::f32_bits(want))
            << what << " " << f.to_string() << " expert " << x << " row " << r << " k " << i << ": "
            << fo[i] << " vs " << dou[i];
      }
    }
  }
}

// Random bytes everywhere, scales random but valid: f32/f16/bf16 normal(0, 1) of any sign, e4m3
// any non-NaN code, e8m0 codes up to 252 (beyond, 6 * 2^(c-127) overflows fp32 before the global
// scale is applied; the quantizer never gets there for finite inputs below 2^127).
void randomize(QuantizedFc* q, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (uint8_t& b : q->weight) b = static_cast<uint8_t>(rng());
  for (uint8_t& b : q->zero_points) b = static_cast<uint8_t>(rng());
  for (float& g : q->global_scale) g = normal(rng);
  const DType sd = q->format.scale_dtype;
  const size_t count = q->scales.size() / dtype_size(sd);
  for (size_t i = 0; i < count; ++i) {
    switch (sd) {
      case DType::kF8E4M3: {
        uint8_t c = static_cast<uint8_t>(rng());
        if ((c & 0x7F) == 0x7F) c = 0x7E;
        q->scales[i] = c;
        break;
      }
      case DType::kF8E8M0:
        q->scales[i] = static_cast<uint8_t>(rng() % 253);
        break;
      case DType::kF16: {
        const uint16_t h = num::f32_to_f16(normal(rng));
        std::memcpy(&q->scales[2 * i], &h, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t h = num::f32_to_bf16(normal(rng));
        std::memcpy(&q->scales[2 * i], &h, 2);
        break;
      }
      default: {
        const float s = normal(rng);
        std::memcpy(&q->scales[4 * i], &s, 4);
      }
    }
  }
}

TEST(Dequantize, FloatEqualsRoundedDoubleForEveryConfig) {
  const int64_t e = 2, n = 6;
  for (const FcFormat& f : all_configs()) {
    // K = 262 exercises the per-channel tail (K not a multiple of 8) and fp8_block edges.
    const bool odd_k_ok = f.info().kind == FormatKind::kFp8 ||
                          (f.info().kind == FormatKind::kInteger && f.block_size == 0);
    for (int64_t k : {256, 262}) {
      if (k == 262 && !odd_k_ok) continue;
      for (float mag : {1.0f, 1e-3f, 3e4f}) {
        std::vector<float> w = test::gaussian(e * n * k, test::fresh_seed(), mag);
        const QuantizedFc q = quantize_or_die(f, w, e, n, k);
        expect_float_is_rounded_double(f, q.view(), e, n, k, "quantized");
      }
      QuantizedFc q;
      ASSERT_TRUE(allocate_fc(f, e, n, k, &q).is_ok());
      randomize(&q, test::fresh_seed());
      expect_float_is_rounded_double(f, q.view(), e, n, k, "random bytes");
    }
  }
}

// Element [x, r, i] of a raw-layout FC by the documented formula, read element by element.
double documented_value(const QuantizedFc& q, int64_t x, int64_t r, int64_t i) {
  const FcFormat& f = q.format;
  const int64_t n = q.n, k = q.k, bs = f.block_size;
  const int bits = f.bits();
  switch (f.info().kind) {
    case FormatKind::kInteger: {
      const int64_t nb = bs ? k / bs : 1, b = bs ? i / bs : 0;
      const unsigned code = bits_at(q.weight.data() + (x * n + r) * ((k * bits + 7) / 8), i, bits);
      unsigned zp = 1u << (bits - 1);
      if (f.zero_points && bs) {
        zp = bits_at(q.zero_points.data() + (x * n + r) * ((nb * bits + 7) / 8), b, bits);
      } else if (f.zero_points) {
        zp = bits_at(q.zero_points.data() + x * ((n * bits + 7) / 8), r, bits);
      }
      return (static_cast<double>(code) - zp) * scale_at(q, (x * n + r) * nb + b);
    }
    case FormatKind::kFp4: {
      const bool kp = f.fp4_layout == Fp4Layout::kKPacked;
      const uint8_t byte =
          kp ? q.weight[(x * n + r) * (k / 2) + i / 2] : q.weight[(x * k + i) * (n / 2) + r / 2];
      const int shift = 4 * static_cast<int>(kp ? (i & 1) : (r & 1));
      const double code = num::e2m1_to_f32(static_cast<uint8_t>((byte >> shift) & 15));
      return code * scale_at(q, (x * n + r) * (k / bs) + i / bs) * q.global_scale[x];
    }
    case FormatKind::kFp8: {
      const double code = num::e4m3_to_f32(q.weight[(x * n + r) * k + i]);
      if (f.format == WeightFormat::kFp8) return code * q.global_scale[x];
      const int64_t nbk = (k + bs - 1) / bs, nbn = (n + bs - 1) / bs;
      return code * scale_at(q, (x * nbn + r / bs) * nbk + i / bs);
    }
  }
  return 0;
}

TEST(Dequantize, DoubleIsTheDocumentedFormula) {
  const int64_t e = 2, n = 4, k = 256;
  for (const FcFormat& f : all_configs()) {
    QuantizedFc q;
    ASSERT_TRUE(allocate_fc(f, e, n, k, &q).is_ok()) << f.to_string();
    randomize(&q, test::fresh_seed());
    const FcWeights w = q.view();
    std::vector<double> got(k);
    for (int64_t x = 0; x < e; ++x) {
      for (int64_t r = 0; r < n; ++r) {
        dequantize_row<double>(f, w, n, k, x, r, got.data());
        for (int64_t i = 0; i < k; ++i) {
          const double want = documented_value(q, x, r, i);
          if (std::isnan(want) && std::isnan(got[i])) continue;
          ASSERT_EQ(got[i], want) << f.to_string() << " row " << r << " k " << i;
        }
      }
    }
  }
}

// ---- error budgets ----

TEST(Budgets, RoundTripErrorIsPositiveAndWithinBudget) {
  const int64_t e = 2, n = 16, k = 256;
  for (const FcFormat& f : all_configs()) {
    const std::vector<float> w = test::gaussian(e * n * k, test::fresh_seed());
    const QuantizedFc q = quantize_or_die(f, w, e, n, k);
    const std::vector<float> deq = dequantize_all(q);
    const double err = test::rel_norm(deq.data(), w.data(), w.size());
    const double budget = quantization_error_budget(f);
    EXPECT_LE(err, budget) << f.to_string();
    EXPECT_GT(err, 0.0) << f.to_string();
    EXPECT_LT(budget, 1.0) << f.to_string();
  }
}

TEST(Budgets, OrderFollowsPrecision) {
  for (int bs : {0, 16, 32, 64, 128, 256}) {
    for (bool zp : {false, true}) {
      double prev = 2.0;
      for (WeightFormat wf :
           {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kInt4, WeightFormat::kInt8}) {
        const double b = quantization_error_budget(make_format(wf, bs, zp));
        EXPECT_LT(b, prev);
        prev = b;
      }
    }
  }
}

// ---- fp4 repacking ----

TEST(Fp4Repack, IsTheDocumentedPermutationBothWays) {
  const int64_t e = 2, n = 6, k = 512;  // K > 256 also crosses the N-packed decode's chunking
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<uint8_t> kp(e * n * k / 2), np(kp.size()), back(kp.size());
  for (uint8_t& b : kp) b = static_cast<uint8_t>(rng());
  fp4_repack(Fp4Layout::kKPacked, kp.data(), e, n, k, np.data());
  for (int64_t x = 0; x < e; ++x) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const unsigned from = (kp[(x * n + r) * (k / 2) + c / 2] >> (4 * (c & 1))) & 15u;
        const unsigned to = (np[(x * k + c) * (n / 2) + r / 2] >> (4 * (r & 1))) & 15u;
        ASSERT_EQ(from, to) << x << " " << r << " " << c;
      }
    }
  }
  fp4_repack(Fp4Layout::kNPacked, np.data(), e, n, k, back.data());
  EXPECT_EQ(back, kp);
  std::vector<uint8_t> np2(np.size()), kp2(np.size());
  for (uint8_t& b : np2) b = static_cast<uint8_t>(rng());
  fp4_repack(Fp4Layout::kNPacked, np2.data(), e, n, k, kp2.data());
  fp4_repack(Fp4Layout::kKPacked, kp2.data(), e, n, k, back.data());
  EXPECT_EQ(back, np2);
}

TEST(Fp4Repack, BothLayoutsQuantizeAndDequantizeAlike) {
  const int64_t e = 2, n = 6, k = 512;
  const std::vector<float> w = test::gaussian(e * n * k, test::fresh_seed());
  for (WeightFormat wf : {WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    FcFormat fk = default_fc_format(wf), fn = fk;
    fn.fp4_layout = Fp4Layout::kNPacked;
    const QuantizedFc qk = quantize_or_die(fk, w, e, n, k);
    const QuantizedFc qn = quantize_or_die(fn, w, e, n, k);
    std::vector<uint8_t> repacked(qk.weight.size());
    fp4_repack(Fp4Layout::kKPacked, qk.weight.data(), e, n, k, repacked.data());
    EXPECT_EQ(qn.weight, repacked);
    EXPECT_EQ(qn.scales, qk.scales);
    const std::vector<float> dk = dequantize_all(qk), dn = dequantize_all(qn);
    ASSERT_EQ(dk.size(), dn.size());
    for (size_t i = 0; i < dk.size(); ++i) ASSERT_EQ(num::f32_bits(dk[i]), num::f32_bits(dn[i]));
  }
}

}  // namespace
}  // namespace qmoe

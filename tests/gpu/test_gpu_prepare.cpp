// Prepare's packing on the device (src/cuda/prepare/device_pack.h) against the host functions it
// replaced, bit for bit: every integer width, FP4 and FP8 format, row map, activation dtype, scale
// dtype and block, with partial tiles, chunks and unit groups. Outputs start poisoned (0xFF) with
// canaries after them, so an entry left unwritten or a write past the end fails.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/formats/mma_pack.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/prepare/device_pack.h"
#include "gpu_test_util.h"
#include "layer_factory.h"
#include "mixed_formats.h"

namespace qmoe::test {
namespace {

constexpr size_t kCanary = 64;

// Uploads a host vector (an empty one as 16 poisoned bytes: a kernel must not read it).
template <typename T>
void up(const std::vector<T>& v, GpuBuffer* b) {
  if (v.empty()) {
    ASSERT_TRUE(b->allocate(16));
  } else {
    ASSERT_TRUE(b->upload(v.data(), v.size() * sizeof(T)));
  }
}

// A poisoned output of `bytes` with canaries.
void out_buffer(size_t bytes, GpuBuffer* b) { ASSERT_TRUE(b->allocate(bytes, 0xFF, kCanary)); }

// The device result equals `want` byte for byte, and nothing was written past it.
template <typename T>
::testing::AssertionResult same(const std::vector<T>& want, const GpuBuffer& got) {
  if (cudaDeviceSynchronize() != cudaSuccess) {
    return ::testing::AssertionFailure() << "kernel: " << cudaGetErrorString(cudaGetLastError());
  }
  std::vector<T> g;
  auto r = got.download(&g);
  if (!r) return r;
  if (g.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << g.size() << ", want " << want.size();
  }
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] != want[i]) {
      return ::testing::AssertionFailure()
             << "first difference at element " << i << " of " << g.size() << ": device "
             << static_cast<uint64_t>(g[i]) << ", host " << static_cast<uint64_t>(want[i]);
    }
  }
  return got.canary_intact();
}

#define ASSERT_OK(expr)                        \
  do {                                         \
    const Status s_ = (expr);                  \
    ASSERT_TRUE(s_.is_ok()) << s_.to_string(); \
  } while (0)

// The codes, scales and zero points of one integer FC, packed on both sides.
void check_int(FcFormat f, int64_t n, int64_t k, MmaRowMap map, int64_t inter, DType act) {
  SCOPED_TRACE(f.to_string() + " n " + std::to_string(n) + " k " + std::to_string(k) + " map " +
               std::to_string(static_cast<int>(map)));
  const int64_t E = 3;
  QuantizedFc q;
  make_fc(f, E, n, k, fresh_seed(), &q);
  if (::testing::Test::HasFatalFailure()) return;
  const MmaPackShape s = mma_pack_shape(f, n, k, map, inter, act);
  std::vector<uint32_t> words;
  mma_pack_int(s, q.weight.data(), E, &words);
  const int eb = static_cast<int>(dtype_size(f.scale_dtype));
  std::vector<uint8_t> scales, zp;
  mma_pack_scales(s, q.scales.data(), eb, E, &scales);
  GpuBuffer raw, sc, z, ow, os, oz;
  up(q.weight, &raw);
  up(q.scales, &sc);
  out_buffer(words.size() * 4, &ow);
  out_buffer(scales.size(), &os);
  ASSERT_OK(cuda::device_pack_int(s, raw.as<uint8_t>(), E, ow.as<uint32_t>(), 0));
  ASSERT_OK(cuda::device_pack_scales(s, sc.as<uint8_t>(), eb, E, os.as<uint8_t>(), 0));
  EXPECT_TRUE(same(words, ow)) << "codes";
  EXPECT_TRUE(same(scales, os)) << "scales";
  if (!f.zero_points) return;
  mma_pack_zero_points(s, q.zero_points.data(), E, &zp);
  up(q.zero_points, &z);
  out_buffer(zp.size(), &oz);
  ASSERT_OK(cuda::device_pack_zero_points(s, z.as<uint8_t>(), E, oz.as<uint8_t>(), 0));
  EXPECT_TRUE(same(zp, oz)) << "zero points";
}

TEST(DevicePack, IntegerCodesScalesAndZeroPoints) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat wf :
       {WeightFormat::kInt2, WeightFormat::kInt3, WeightFormat::kInt4, WeightFormat::kInt8}) {
    for (int block : {16, 0, 64}) {
      for (bool zp : {false, true}) {
        FcFormat f = default_fc_format(wf);
        f.block_size = block;
        f.zero_points = zp;
        f.scale_dtype = zp ? DType::kF16 : DType::kBF16;
        check_int(f, 48, 128, MmaRowMap::kIdentity, 0, DType::kBF16);
        check_int(f, 40, 192, MmaRowMap::kIdentity, 0, DType::kF16);  // partial tile and chunk
        check_int(f, 2 * 24, 64, MmaRowMap::kGatedInterleaved, 24, DType::kBF16);
        check_int(f, 2 * 20, 320, MmaRowMap::kGatedConcatenated, 20, DType::kF16);
      }
    }
  }
}

// FP4: ORT's N-packed codes repacked K-packed, the codes in the FP4 layout, the 8-bit scales.
TEST(DevicePack, Fp4CodesAndScales) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat wf : {WeightFormat::kNvFp4, WeightFormat::kMxFp4}) {
    for (DType act : {DType::kBF16, DType::kF16}) {
      for (auto [n, k, map, inter] :
           {std::tuple{48L, 128L, MmaRowMap::kIdentity, 0L},
            std::tuple{40L, 96L, MmaRowMap::kIdentity, 0L},
            std::tuple{2 * 20L, 160L, MmaRowMap::kGatedInterleaved, 20L}}) {
        FcFormat f = default_fc_format(wf);
        f.fp4_layout = Fp4Layout::kNPacked;
        SCOPED_TRACE(f.to_string() + " act " + dtype_name(act) + " n " + std::to_string(n) + " k " +
                     std::to_string(k));
        const int64_t E = 2;
        QuantizedFc q;
        make_fc(f, E, n, k, fresh_seed(), &q);
        if (HasFatalFailure()) return;
        std::vector<uint8_t> kp(q.weight.size());
        fp4_repack(Fp4Layout::kNPacked, q.weight.data(), E, n, k, kp.data());
        const MmaPackShape s = mma_pack_shape(f, n, k, map, inter, act);
        std::vector<uint32_t> words;
        mma_pack_fp4(s, kp.data(), E, &words);
        const MmaPackShape bs = mma_fp4_scale_shape(s);
        std::vector<uint8_t> scales;
        mma_pack_scales(bs, q.scales.data(), 1, E, &scales);
        GpuBuffer np, sc, okp, ow, os;
        up(q.weight, &np);
        up(q.scales, &sc);
        out_buffer(kp.size(), &okp);
        out_buffer(words.size() * 4, &ow);
        out_buffer(scales.size(), &os);
        ASSERT_OK(cuda::device_fp4_k_packed(np.as<uint8_t>(), E, n, k, okp.as<uint8_t>(), 0));
        EXPECT_TRUE(same(kp, okp)) << "K-packed codes";
        ASSERT_OK(cuda::device_pack_fp4(s, okp.as<uint8_t>(), E, ow.as<uint32_t>(), 0));
        ASSERT_OK(cuda::device_pack_scales(bs, sc.as<uint8_t>(), 1, E, os.as<uint8_t>(), 0));
        EXPECT_TRUE(same(words, ow)) << "codes";
        EXPECT_TRUE(same(scales, os)) << "scales";
      }
    }
  }
}

// FP8: the codes in the FP8 layout, fp8_block's square-block scales per packed row, and FC1 with a
// separate FC3 packed as one gated FC (both codes; each row's scales).
TEST(DevicePack, Fp8CodesScalesAndSeparateFc3) {
  QMOE_REQUIRE_GPU();
  for (WeightFormat wf : {WeightFormat::kFp8Block, WeightFormat::kFp8}) {
    for (DType act : {DType::kBF16, DType::kF16}) {
      const FcFormat f = default_fc_format(wf);
      const bool block = wf == WeightFormat::kFp8Block;
      const int eb = block ? static_cast<int>(dtype_size(f.scale_dtype)) : 4;
      SCOPED_TRACE(f.to_string() + " act " + dtype_name(act));
      const int64_t E = 3, n = 200, k = 160, inter = 208;
      {  // one FC, identity rows
        QuantizedFc q;
        make_fc(f, E, n, k, fresh_seed(), &q);
        if (HasFatalFailure()) return;
        const MmaPackShape s = mma_pack_shape(f, n, k, MmaRowMap::kIdentity, 0, act);
        std::vector<uint32_t> words;
        mma_pack_fp8(s, q.weight.data(), E, &words);
        GpuBuffer raw, ow;
        up(q.weight, &raw);
        out_buffer(words.size() * 4, &ow);
        ASSERT_OK(cuda::device_pack_fp8(s, raw.as<uint8_t>(), nullptr, E, ow.as<uint32_t>(), 0));
        EXPECT_TRUE(same(words, ow)) << "codes";
        if (block) {
          std::vector<uint8_t> scales;
          mma_pack_scales(s, q.scales.data(), eb, E, &scales);
          GpuBuffer sc, os;
          up(q.scales, &sc);
          out_buffer(scales.size(), &os);
          ASSERT_OK(cuda::device_pack_scales(s, sc.as<uint8_t>(), eb, E, os.as<uint8_t>(), 0));
          EXPECT_TRUE(same(scales, os)) << "block scales";
        }
      }
      QuantizedFc gate, lin;
      make_fc(f, E, inter, k, fresh_seed(), &gate);
      make_fc(f, E, inter, k, fresh_seed(), &lin);
      if (HasFatalFailure()) return;
      MmaPackShape s = mma_pack_shape(f, 2 * inter, k, MmaRowMap::kGatedConcatenated, inter, act);
      s.scale_rows = 1;  // as plan_decode sets it for a separate FC3
      std::vector<uint32_t> words;
      mma_pack_fp8(s, gate.weight.data(), E, &words, lin.weight.data());
      auto src = [&](const QuantizedFc& q) {
        return block ? q.scales
                     : std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(q.global_scale.data()),
                                            reinterpret_cast<const uint8_t*>(
                                                q.global_scale.data() + q.global_scale.size()));
      };
      const std::vector<uint8_t> sg = src(gate), sl = src(lin);
      const int64_t block_rows = block ? f.block_size : inter;
      std::vector<uint8_t> rows, tiled;
      mma_gated_row_scales(s, sg.data(), sl.data(), eb, block_rows, E, &rows);
      mma_pack_scales(s, rows.data(), eb, E, &tiled);
      GpuBuffer g, l, dg, dl, ow, orows, ot;
      up(gate.weight, &g);
      up(lin.weight, &l);
      up(sg, &dg);
      up(sl, &dl);
      out_buffer(words.size() * 4, &ow);
      out_buffer(rows.size(), &orows);
      out_buffer(tiled.size(), &ot);
      ASSERT_OK(
          cuda::device_pack_fp8(s, g.as<uint8_t>(), l.as<uint8_t>(), E, ow.as<uint32_t>(), 0));
      ASSERT_OK(cuda::device_gated_row_scales(s, dg.as<uint8_t>(), dl.as<uint8_t>(), eb, block_rows,
                                              E, orows.as<uint8_t>(), 0));
      ASSERT_OK(cuda::device_pack_scales(s, orows.as<uint8_t>(), eb, E, ot.as<uint8_t>(), 0));
      EXPECT_TRUE(same(words, ow)) << "gate and linear codes";
      EXPECT_TRUE(same(rows, orows)) << "row scales";
      EXPECT_TRUE(same(tiled, ot)) << "tiled row scales";
    }
  }
}

// MXFP4's e4m3 copy (fp4_e4m3.h) against mixed_prepare's host copy, codes and scales bitwise,
// from quantized weights (exact: the flag stays 0), then with one chunk made inexact (a nonzero
// code 15 binades below its neighbour block): the flag set on the device, the host copy's
// `exact` false.
TEST(DevicePack, Mxfp4E4m3CopyEqualsTheHostTwin) {
  QMOE_REQUIRE_GPU();
  const int64_t E = 3, n = 40, k = 320;  // k: five 64-K chunks
  const FcFormat f = default_fc_format(WeightFormat::kMxFp4);
  QuantizedFc q;
  make_fc(f, E, n, k, fresh_seed(), &q);
  if (HasFatalFailure()) return;
  for (bool widen : {false, true}) {
    SCOPED_TRACE(widen ? "one chunk widened" : "as quantized");
    if (widen) {  // expert 1, row 7, chunk 2: blocks 4 and 5
      uint8_t* sc = &q.scales[static_cast<size_t>((1 * n + 7) * (k / 32) + 4)];
      sc[1] = 140;
      sc[0] = 125;
      q.weight[static_cast<size_t>((1 * n + 7) * (k / 2) + 2 * 32)] = 0x11;  // 0.5, 0.5
    }
    cuda::MixedCopy copy;
    cuda::mixed_prepare(cuda::MixedCodes::kE4m3, f, DType::kBF16, E, n, k, q.weight.data(),
                        q.scales.data(), nullptr, q.global_scale.data(), &copy);
    EXPECT_EQ(copy.exact, !widen);
    ASSERT_EQ(copy.chunk, 64);
    GpuBuffer codes, sc, gs, oc, os, flag;
    up(q.weight, &codes);
    up(q.scales, &sc);
    up(q.global_scale, &gs);
    out_buffer(copy.codes.size(), &oc);
    out_buffer(copy.scales.size(), &os);
    ASSERT_TRUE(flag.allocate(4, 0x00, kCanary));
    ASSERT_OK(cuda::device_mxfp4_e4m3(codes.as<uint8_t>(), sc.as<uint8_t>(), gs.as<float>(), E, n,
                                      k, oc.as<uint8_t>(), os.as<float>(), flag.as<int32_t>(), 0));
    EXPECT_TRUE(same(copy.codes, oc)) << "codes";
    EXPECT_TRUE(same(copy.scales, os)) << "scales";
    std::vector<int32_t> inexact;
    ASSERT_TRUE(flag.download(&inexact));
    EXPECT_EQ(inexact.at(0) != 0, widen);
  }
  const Status bad =
      cuda::device_mxfp4_e4m3(nullptr, nullptr, nullptr, E, n, 96, nullptr, nullptr, nullptr, 0);
  EXPECT_NE(bad.message().find("k: expected a multiple of 64"), std::string::npos) << bad.message();
}

// The mixed-input GEMM's copy (codes, scales, zeros) of every kind against mixed_prepare.
TEST(DevicePack, MixedCopyOfEveryKind) {
  QMOE_REQUIRE_GPU();
  const int64_t E = 3, n = 208, k = 256;  // n: kInt4's 16-row multiple, a partial 128-row tile
  for (const FcFormat& f : mixed_test_formats()) {
    for (DType act : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(f.to_string() + " act " + dtype_name(act));
      const cuda::MixedCodes kind = cuda::mixed_codes_for(f, act, n, k);
      ASSERT_NE(kind, cuda::MixedCodes::kNone);
      QuantizedFc q;
      make_fc(f, E, n, k, fresh_seed(), &q);
      if (HasFatalFailure()) return;
      cuda::MixedCopy copy;
      cuda::mixed_prepare(kind, f, act, E, n, k, q.weight.data(), q.scales.data(),
                          q.zero_points.data(), q.global_scale.data(), &copy);
      GpuBuffer codes, sc, zp, gs, oc, os, oz;
      up(q.weight, &codes);
      up(q.scales, &sc);
      up(q.zero_points, &zp);
      up(q.global_scale, &gs);
      // The signed copy as prepare builds it, flipped and shuffled in one pass (against the host
      // twin's shuffle of the host copy); the other kinds read ORT's codes.
      ASSERT_EQ(copy.codes.empty(), !cuda::mixed_codes_shuffled(kind));
      if (!copy.codes.empty()) {
        out_buffer(copy.codes.size(), &oc);
        const int bits = cuda::mixed_code_bits(kind);
        ASSERT_OK(cuda::mixed_shuffle_codes(codes.as<uint8_t>(), oc.as<uint8_t>(), E, n, k, bits,
                                            /*flip=*/true, 0));
        std::vector<uint8_t> shuffled(copy.codes.size());
        cuda::mixed_shuffle_codes_host(copy.codes.data(), shuffled.data(), E, n, k, bits);
        EXPECT_TRUE(same(shuffled, oc)) << "codes";
      }
      out_buffer(copy.scales.size(), &os);
      if (!copy.zeros.empty()) out_buffer(copy.zeros.size() * 4, &oz);
      ASSERT_OK(cuda::device_mixed_scales(kind, f, act, E, n, k, sc.as<uint8_t>(), zp.as<uint8_t>(),
                                          gs.as<float>(), os.get(),
                                          copy.zeros.empty() ? nullptr : oz.as<float>(), 0));
      EXPECT_TRUE(same(copy.scales, os)) << "scales";
      if (cuda::mixed_codes_shuffled(kind)) {
        // FC1 in GluRows order (glu_source_row, n = 2 I): the host copy's rows reordered, then
        // shuffled by the host twin, against the device's shuffle, scales and zeros with the
        // order.
        const int bits = cuda::mixed_code_bits(kind);
        const int64_t row_bytes = k * bits / 8;
        const int64_t sb = cuda::mixed_scale_bytes(kind);
        const int64_t kb = static_cast<int64_t>(copy.scales.size()) / (E * n * sb);
        for (cuda::GluRows glu : {cuda::GluRows::kConcatenated, cuda::GluRows::kInterleaved}) {
          SCOPED_TRACE("glu " + std::to_string(static_cast<int>(glu)));
          std::vector<uint8_t> rows(copy.codes.size()), want(copy.codes.size());
          std::vector<uint8_t> want_scales(copy.scales.size());
          std::vector<uint32_t> want_zeros(copy.zeros.size());
          for (int64_t e = 0; e < E; ++e) {
            for (int64_t r = 0; r < n; ++r) {
              const int64_t from = cuda::glu_source_row(glu, n / 2, r);
              std::memcpy(&rows[static_cast<size_t>((e * n + r) * row_bytes)],
                          &copy.codes[static_cast<size_t>((e * n + from) * row_bytes)],
                          static_cast<size_t>(row_bytes));
              for (int64_t b = 0; b < kb; ++b) {
                const size_t to = static_cast<size_t>((e * kb + b) * n + r);
                const size_t at = static_cast<size_t>((e * kb + b) * n + from);
                std::memcpy(&want_scales[to * sb], &copy.scales[at * sb], static_cast<size_t>(sb));
                if (!copy.zeros.empty()) std::memcpy(&want_zeros[to], &copy.zeros[at], 4);
              }
            }
          }
          cuda::mixed_shuffle_codes_host(rows.data(), want.data(), E, n, k, bits);
          GpuBuffer gc, gsc, gz;
          out_buffer(want.size(), &gc);
          out_buffer(want_scales.size(), &gsc);
          if (!want_zeros.empty()) out_buffer(want_zeros.size() * 4, &gz);
          ASSERT_OK(cuda::mixed_shuffle_codes(codes.as<uint8_t>(), gc.as<uint8_t>(), E, n, k, bits,
                                              /*flip=*/true, 0, glu, n / 2));
          EXPECT_TRUE(same(want, gc)) << "codes in GluRows order";
          ASSERT_OK(cuda::device_mixed_scales(kind, f, act, E, n, k, sc.as<uint8_t>(),
                                              zp.as<uint8_t>(), gs.as<float>(), gsc.get(),
                                              want_zeros.empty() ? nullptr : gz.as<float>(), 0,
                                              glu, n / 2));
          EXPECT_TRUE(same(want_scales, gsc)) << "scales in GluRows order";
          if (!want_zeros.empty()) EXPECT_TRUE(same(want_zeros, gz)) << "zeros in GluRows order";
          const Status bad = cuda::mixed_shuffle_codes(codes.as<uint8_t>(), gc.as<uint8_t>(), E, n,
                                                       k, bits, true, 0, glu, n / 2 + 8);
          EXPECT_NE(bad.message().find("glu: expected n = 2 inter"), std::string::npos)
              << bad.message();
        }
      }
      if (copy.zeros.empty()) continue;
      // Bitwise: compare the floats' bits.
      std::vector<uint32_t> bits(copy.zeros.size());
      std::memcpy(bits.data(), copy.zeros.data(), bits.size() * 4);
      EXPECT_TRUE(same(bits, oz)) << "zeros";
    }
  }
}

// The shuffle of int4 and int8 codes (cutlass_mixed_shuffle.cuh): the host twin, which places
// each code by CuTe's layout of the whole matrix, against the drawn order recomputed here from the
// wgmma fragment (lane t holds rows t / 4 and + 8 at k = 2 (t % 4) + {0, 1, 8, 9}; atoms along k
// first); the device kernel against the twin, with and without the top-bit flip. Shapes with one
// atom, with several along n and k, the 208 rows of a partial 128-row tile, and k = 272 (not a
// multiple of the 64-wide K tile).
TEST(DevicePack, MixedShuffleOfInt4AndInt8) {
  QMOE_REQUIRE_GPU();
  struct Shape {
    int64_t e, n, k;
  };
  for (int bits : {4, 8}) {
    for (const Shape& sh :
         {Shape{1, 16, 16}, Shape{3, 48, 128}, Shape{2, 208, 64}, Shape{1, 32, 272}}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " E " + std::to_string(sh.e) + " n " +
                   std::to_string(sh.n) + " k " + std::to_string(sh.k));
      const size_t bytes = static_cast<size_t>(sh.e * sh.n * sh.k * bits / 8);
      std::vector<uint8_t> codes(bytes);
      std::mt19937_64 rng(fresh_seed());
      for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
      std::vector<uint8_t> host(bytes);
      cuda::mixed_shuffle_codes_host(codes.data(), host.data(), sh.e, sh.n, sh.k, bits);
      auto code_at = [bits](const std::vector<uint8_t>& v, int64_t i) {
        return bits == 8 ? v[static_cast<size_t>(i)]
                         : (v[static_cast<size_t>(i / 2)] >> (4 * (i & 1))) & 15;
      };
      for (int64_t e = 0; e < sh.e; ++e) {
        for (int64_t m = 0; m < sh.n; ++m) {
          for (int64_t kk = 0; kk < sh.k; ++kk) {
            const int64_t r = m % 16, c = kk % 16;
            const int64_t lane = (r % 8) * 4 + (c % 8) / 2;
            const int64_t v = (c % 2) + 2 * (r / 8) + 4 * (c / 8);
            // int4: 0 2 4 6 1 3 5 7 in one word; int8: 0 2 1 3 | 4 6 5 7.
            const int64_t pos =
                bits == 4 ? (v >> 1) + 4 * (v & 1) : 2 * (v & 1) + ((v >> 1) & 1) + 4 * (v >> 2);
            const int64_t at =
                8 * lane + pos + 256 * (kk / 16 + (sh.k / 16) * (m / 16)) + e * sh.n * sh.k;
            ASSERT_EQ(code_at(host, at), code_at(codes, e * sh.n * sh.k + m * sh.k + kk))
                << "e " << e << " m " << m << " k " << kk;
          }
        }
      }
      GpuBuffer in, out, flipped;
      up(codes, &in);
      out_buffer(bytes, &out);
      ASSERT_OK(cuda::mixed_shuffle_codes(in.as<uint8_t>(), out.as<uint8_t>(), sh.e, sh.n, sh.k,
                                          bits, false, 0));
      EXPECT_TRUE(same(host, out));
      // With the flip: each code's top bit, nothing else.
      for (uint8_t& b : host) b ^= bits == 4 ? 0x88 : 0x80;
      out_buffer(bytes, &flipped);
      ASSERT_OK(cuda::mixed_shuffle_codes(in.as<uint8_t>(), flipped.as<uint8_t>(), sh.e, sh.n, sh.k,
                                          bits, true, 0));
      EXPECT_TRUE(same(host, flipped));
    }
  }
  GpuBuffer a, b;
  out_buffer(64, &a);
  out_buffer(64, &b);
  Status bad = cuda::mixed_shuffle_codes(a.as<uint8_t>(), b.as<uint8_t>(), 1, 8, 16, 4, false, 0);
  EXPECT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("n a multiple of 16"), std::string::npos) << bad.message();
  bad = cuda::mixed_shuffle_codes(a.as<uint8_t>(), b.as<uint8_t>(), 1, 16, 16, 2, false, 0);
  EXPECT_NE(bad.message().find("bits: expected 4 or 8"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace qmoe::test

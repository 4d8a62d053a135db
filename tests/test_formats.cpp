// Weight formats: the traits table, tensor shapes and checks, and the raw layouts (bitwise against
// hand-computed bytes). The quantizers' formulas, the dequantizers' exactness, the error budgets
// and the fp4 repacking are in test_quantizers.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "format_test_util.h"
#include "qmoe/format.h"
#include "qmoe/quantize.h"
#include "test_util.h"

namespace qmoe {
namespace {

using namespace format_test;

// ---- the traits table ----

TEST(FormatTable, IsGeneratedFromTheList) {
  ASSERT_EQ(static_cast<int>(all_formats().size()), kNumWeightFormats);
  std::set<std::string> names;
  for (size_t i = 0; i < all_formats().size(); ++i) {
    const WeightFormat wf = all_formats()[i];
    const FormatInfo& fi = format_info(wf);
    EXPECT_EQ(fi.id, wf);
    EXPECT_EQ(static_cast<size_t>(wf), i);
    EXPECT_TRUE(names.insert(fi.name).second) << fi.name;
    WeightFormat parsed;
    ASSERT_TRUE(parse_weight_format(fi.name, &parsed)) << fi.name;
    EXPECT_EQ(parsed, wf);
    const FcFormat f = default_fc_format(wf);
    EXPECT_EQ(f.format, wf);
    EXPECT_EQ(f.block_size, fi.default_block);
    EXPECT_FALSE(f.zero_points);
    EXPECT_TRUE(check_fc_format(f, 256, 512, "fc1").is_ok()) << fi.name;
  }
  WeightFormat out;
  EXPECT_FALSE(parse_weight_format("int5", &out));
  EXPECT_FALSE(parse_weight_format("", &out));
}

TEST(FormatTable, ToStringNamesTheConfiguration) {
  EXPECT_EQ(make_format(WeightFormat::kInt4, 128, true).to_string(), "int4 b128 zp");
  EXPECT_EQ(make_format(WeightFormat::kInt4, 0).to_string(), "int4 per-channel");
  EXPECT_EQ(make_format(WeightFormat::kInt2, 64, false, DType::kF16).to_string(),
            "int2 b64 (f16 scales)");
  EXPECT_EQ(default_fc_format(WeightFormat::kNvFp4).to_string(), "nvfp4");
  FcFormat mx = default_fc_format(WeightFormat::kMxFp4);
  mx.fp4_layout = Fp4Layout::kNPacked;
  EXPECT_EQ(mx.to_string(), "mxfp4 (N-packed)");
  EXPECT_EQ(default_fc_format(WeightFormat::kFp8).to_string(), "fp8");
  EXPECT_EQ(make_format(WeightFormat::kFp8Block, 128, false, DType::kBF16).to_string(),
            "fp8_block b128 (bf16 scales)");
}

// ---- shapes ----

void expect_dims(const int64_t* got, int rank, std::vector<int64_t> want, const std::string& what) {
  ASSERT_EQ(rank, static_cast<int>(want.size())) << what;
  for (int i = 0; i < rank; ++i) EXPECT_EQ(got[i], want[i]) << what << " dim " << i;
}

TEST(Shapes, EveryConfigFollowsTheSpec) {
  const int64_t e = 3, n = 24;
  for (int64_t k : {256, 768}) {
    for (const FcFormat& f : all_configs()) {
      const FcTensorShapes s = fc_tensor_shapes(f, e, n, k);
      const FormatInfo& fi = f.info();
      const std::string what = f.to_string() + " K=" + std::to_string(k);
      const int bits = fi.code_bits;
      const int64_t bs = f.block_size;
      switch (fi.kind) {
        case FormatKind::kInteger:
          EXPECT_EQ(s.weight_dtype, DType::kU8);
          expect_dims(s.weight, s.weight_rank, {e, n, (k * bits + 7) / 8}, what);
          EXPECT_EQ(s.scale_dtype, f.scale_dtype);
          if (bs == 0) {
            expect_dims(s.scale, s.scale_rank, {e, n}, what);
          } else {
            expect_dims(s.scale, s.scale_rank, {e, n, k / bs}, what);
          }
          if (!f.zero_points) {
            EXPECT_EQ(s.zero_point_rank, 0) << what;
          } else if (bs == 0) {
            expect_dims(s.zero_point, s.zero_point_rank, {e, (n * bits + 7) / 8}, what);
          } else {
            expect_dims(s.zero_point, s.zero_point_rank, {e, n, (k / bs * bits + 7) / 8}, what);
          }
          EXPECT_FALSE(s.global_scale) << what;
          break;
        case FormatKind::kFp4:
          EXPECT_EQ(s.weight_dtype, DType::kU8);
          if (f.fp4_layout == Fp4Layout::kNPacked) {
            expect_dims(s.weight, s.weight_rank, {e, k, n / 2}, what);
          } else {
            expect_dims(s.weight, s.weight_rank, {e, n, k / 2}, what);
          }
          EXPECT_EQ(s.scale_dtype,
                    f.format == WeightFormat::kNvFp4 ? DType::kF8E4M3 : DType::kF8E8M0);
          expect_dims(s.scale, s.scale_rank,
                      {e, n, k / (f.format == WeightFormat::kNvFp4 ? 16 : 32)}, what);
          EXPECT_EQ(s.zero_point_rank, 0) << what;
          EXPECT_TRUE(s.global_scale) << what;
          break;
        case FormatKind::kFp8:
          EXPECT_EQ(s.weight_dtype, DType::kF8E4M3);
          expect_dims(s.weight, s.weight_rank, {e, n, k}, what);
          if (f.format == WeightFormat::kFp8) {
            EXPECT_EQ(s.scale_rank, 0) << what;
            EXPECT_TRUE(s.global_scale) << what;
          } else {
            EXPECT_EQ(s.scale_dtype, f.scale_dtype);
            expect_dims(s.scale, s.scale_rank, {e, (n + bs - 1) / bs, (k + bs - 1) / bs}, what);
            EXPECT_FALSE(s.global_scale) << what;
          }
          EXPECT_EQ(s.zero_point_rank, 0) << what;
          break;
      }
    }
  }
}

TEST(Shapes, RealModels) {
  // Qwen3-30B-A3B: H=2048 I=768 E=128, int4 b128; FC1 is [2*768, 2048].
  FcTensorShapes s = fc_tensor_shapes(make_format(WeightFormat::kInt4, 128), 128, 1536, 2048);
  expect_dims(s.weight, s.weight_rank, {128, 1536, 1024}, "qwen3 fc1 weight");
  expect_dims(s.scale, s.scale_rank, {128, 1536, 16}, "qwen3 fc1 scales");
  // GPT-OSS-20B: H=2880 I=2880 E=32, mxfp4 in ORT's CUDA layout; FC1 is [5760, 2880].
  FcFormat mx = default_fc_format(WeightFormat::kMxFp4);
  mx.fp4_layout = Fp4Layout::kNPacked;
  s = fc_tensor_shapes(mx, 32, 5760, 2880);
  expect_dims(s.weight, s.weight_rank, {32, 2880, 2880}, "gpt-oss fc1 weight");
  expect_dims(s.scale, s.scale_rank, {32, 5760, 90}, "gpt-oss fc1 scales");
  // DeepSeek-V3: H=7168 I=2048, fp8 128x128 blocks; FC2 is [7168, 2048].
  s = fc_tensor_shapes(make_format(WeightFormat::kFp8Block, 128), 256, 7168, 2048);
  expect_dims(s.scale, s.scale_rank, {256, 56, 16}, "deepseek fc2 scales");
  // int3 across bytes: K = 2880 -> 1080 bytes per row; per-channel zero points N=5 -> 2 bytes.
  s = fc_tensor_shapes(make_format(WeightFormat::kInt3, 0, true), 4, 5, 2880);
  expect_dims(s.weight, s.weight_rank, {4, 5, 1080}, "int3 weight");
  expect_dims(s.zero_point, s.zero_point_rank, {4, 2}, "int3 zero points");
  // int2 b32 zero points: K = 160 -> 5 blocks -> 10 bits -> 2 bytes per row.
  s = fc_tensor_shapes(make_format(WeightFormat::kInt2, 32, true), 2, 6, 160);
  expect_dims(s.zero_point, s.zero_point_rank, {2, 6, 2}, "int2 zero points");
}

TEST(Shapes, BytesPerExpert) {
  // 1536 * 1024 codes + 1536 * 16 f16 scales.
  EXPECT_EQ(
      fc_bytes_per_expert(make_format(WeightFormat::kInt4, 128, false, DType::kF16), 1536, 2048),
      1536 * 1024 + 1536 * 16 * 2);
  // + zero points 1536 * ceil(16 * 4 / 8).
  EXPECT_EQ(
      fc_bytes_per_expert(make_format(WeightFormat::kInt4, 128, true, DType::kF16), 1536, 2048),
      1536 * 1024 + 1536 * 16 * 2 + 1536 * 8);
  EXPECT_EQ(fc_bytes_per_expert(default_fc_format(WeightFormat::kNvFp4), 64, 128),
            64 * 64 + 64 * 8 + 4);
  EXPECT_EQ(fc_bytes_per_expert(default_fc_format(WeightFormat::kFp8), 10, 20), 200 + 4);
  EXPECT_EQ(fc_bytes_per_expert(make_format(WeightFormat::kFp8Block, 128), 300, 200),
            300 * 200 + 3 * 2 * 4);
  for (const FcFormat& f : all_configs()) {  // equals what the buffers of one expert hold
    QuantizedFc q;
    ASSERT_TRUE(allocate_fc(f, 1, 24, 256, &q).is_ok());
    EXPECT_EQ(fc_bytes_per_expert(f, 24, 256),
              static_cast<int64_t>(q.weight.size() + q.scales.size() + q.zero_points.size() +
                                   4 * q.global_scale.size()))
        << f.to_string();
  }
}

// ---- check_fc_format ----

TEST(CheckFcFormat, AcceptsEveryAllowedConfig) {
  for (const FcFormat& f : all_configs()) {
    EXPECT_TRUE(check_fc_format(f, 24, 256, "fc1").is_ok()) << f.to_string();
  }
  EXPECT_TRUE(check_fc_format(make_format(WeightFormat::kInt4, 0), 3, 7, "fc1").is_ok());
  EXPECT_TRUE(check_fc_format(make_format(WeightFormat::kFp8Block, 128), 300, 200, "fc1").is_ok());
}

TEST(CheckFcFormat, RejectsWithAMessageNamingTheArgument) {
  struct Case {
    FcFormat f;
    int64_t n, k;
    const char* what;
    const char* message;
  };
  FcFormat nvfp4 = default_fc_format(WeightFormat::kNvFp4);
  FcFormat nvfp4_npacked = nvfp4;
  nvfp4_npacked.fp4_layout = Fp4Layout::kNPacked;
  FcFormat nvfp4_zp = nvfp4;
  nvfp4_zp.zero_points = true;
  FcFormat nvfp4_f32 = nvfp4;
  nvfp4_f32.scale_dtype = DType::kF32;
  FcFormat nvfp4_b32 = nvfp4;
  nvfp4_b32.block_size = 32;
  FcFormat mxfp4_e4m3 = default_fc_format(WeightFormat::kMxFp4);
  mxfp4_e4m3.scale_dtype = DType::kF8E4M3;
  FcFormat fp8_b128 = default_fc_format(WeightFormat::kFp8);
  fp8_b128.block_size = 128;
  FcFormat fp8_zp = default_fc_format(WeightFormat::kFp8Block);
  fp8_zp.zero_points = true;
  const Case cases[] = {
      {make_format(WeightFormat::kInt4, 48), 64, 768, "fc1",
       "fc1: block_size 48 is not a power of two in [16, 256]"},
      {make_format(WeightFormat::kInt4, 512), 64, 1024, "fc1",
       "fc1: block_size 512 is not a power of two in [16, 256]"},
      {make_format(WeightFormat::kInt8, 8), 64, 1024, "fc3",
       "fc3: block_size 8 is not a power of two in [16, 256]"},
      {make_format(WeightFormat::kInt2, -1), 64, 1024, "fc1",
       "fc1: block_size -1 is not a power of two in [16, 256]"},
      {make_format(WeightFormat::kInt4, 128), 2880, 2880, "fc2",
       "fc2: block_size 128 does not divide K = 2880"},
      {nvfp4_zp, 64, 64, "fc1", "fc1: zero points are only defined for integer formats"},
      {fp8_zp, 64, 64, "fc2", "fc2: zero points are only defined for integer formats"},
      {make_format(WeightFormat::kInt4, 128, false, DType::kF8E4M3), 64, 256, "fc1",
       "fc1: scale_dtype f8e4m3 is not valid for int4 (expected f32, f16 or bf16)"},
      {make_format(WeightFormat::kInt3, 0, false, DType::kF64), 64, 256, "fc1",
       "fc1: scale_dtype f64 is not valid for int3"},
      {nvfp4_f32, 64, 256, "fc1", "fc1: scale_dtype f32 is not valid for nvfp4 (expected f8e4m3)"},
      {mxfp4_e4m3, 64, 256, "fc2", "fc2: scale_dtype f8e4m3 is not valid for mxfp4"},
      {make_format(WeightFormat::kFp8, 0, false, DType::kF16), 64, 256, "fc1",
       "fc1: scale_dtype f16 is not valid for fp8"},
      {make_format(WeightFormat::kFp8Block, 128, false, DType::kF8E4M3), 64, 256, "fc1",
       "fc1: scale_dtype f8e4m3 is not valid for fp8_block"},
      {nvfp4_npacked, 7, 64, "fc2", "fc2: N = 7 must be even for the N-packed fp4 layout"},
      {nvfp4, 8, 40, "fc1", "fc1: K = 40 is not a multiple of the nvfp4 block 16"},
      {default_fc_format(WeightFormat::kMxFp4), 8, 48, "fc1",
       "fc1: K = 48 is not a multiple of the mxfp4 block 32"},
      {nvfp4_b32, 8, 64, "fc1", "fc1: block_size 32 is not valid for nvfp4 (expected 16)"},
      {fp8_b128, 8, 64, "fc1", "fc1: block_size 128 is not valid for fp8"},
      {make_format(WeightFormat::kFp8Block, 0), 8, 64, "fc1",
       "fc1: block_size 0 is not valid for fp8_block (expected >= 1)"},
      {make_format(WeightFormat::kInt4, 128), 0, 256, "fc1", "fc1: N must be >= 1, got 0"},
      {make_format(WeightFormat::kInt4, 0), 8, -3, "fc2", "fc2: K must be >= 1, got -3"},
  };
  for (const Case& c : cases) {
    const Status st = check_fc_format(c.f, c.n, c.k, c.what);
    ASSERT_FALSE(st.is_ok()) << c.message;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind(c.message, 0), 0u)
        << "got \"" << st.message() << "\", expected it to start with \"" << c.message << "\"";
  }
}

// ---- raw layouts, bitwise against hand-computed bytes ----

TEST(Packing, Int4LowNibbleIsEvenK) {
  // amax 7.5 gives scale 7.5 / 7.5 = 1, so q = round_half_away(w) + 8 and -7.5 -> 0.
  const std::vector<float> w = {-7.5f, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
  for (int bs : {0, 16}) {
    const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt4, bs), w, 1, 1, 16);
    const std::vector<uint8_t> want = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE};
    EXPECT_EQ(q.weight, want) << "block " << bs;
    EXPECT_EQ(scale_at(q, 0), 1.0f);
  }
}

TEST(Packing, IntegerTiesRoundHalfAwayFromZero) {
  // amax 7.5 gives scale 1: 0.5 -> 1, 2.5 -> 3, -0.5 -> -1 (half to even would give 0, 2, 0), and
  // 7.5 -> 8 clips to 7.
  const std::vector<float> w = {7.5f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 6.5f,
                                0,    0,    0,    0,    0,     0,     0,     0};
  const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt4, 0), w, 1, 1, 16);
  // q = 15 9 10 11 7 6 5 15 8 8 8 8 8 8 8 8
  const std::vector<uint8_t> want = {0x9F, 0xBA, 0x67, 0xF5, 0x88, 0x88, 0x88, 0x88};
  EXPECT_EQ(q.weight, want);
}

TEST(Packing, Int2FourCodesPerByte) {
  // amax 1.5 gives scale 1; q = round_half_away(w) + 2.
  const std::vector<float> w = {-1.5f, -1, 0, 1, 1, 0, -1, -1.5f};
  const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt2, 0), w, 1, 1, 8);
  // q = 0 1 2 3 | 3 2 1 0 -> q0 | q1 << 2 | q2 << 4 | q3 << 6.
  const std::vector<uint8_t> want = {0xE4, 0x1B};
  EXPECT_EQ(q.weight, want);
}

TEST(Packing, Int3CrossesBytesAndZeroesPadding) {
  // Two rows of K = 10 (30 bits -> 4 bytes, 2 padding bits); amax 3.5 gives scale 1.
  const std::vector<float> w = {
      -3.5f, -3,    -2, -1, 0,  1, 2,  3, 3,     -3.5f,  // q 0..7 7 0
      3,     -3.5f, -3, 2,  -1, 1, -2, 0, -3.5f, 3};     // q 7 0 1 6 3 5 2 4 0 7
  const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt3, 0), w, 1, 2, 10);
  // Row 0: bits 3 (q1) and 7 (q2's low bit... q2 = 2 sets bit 7); q3 = 3 -> bits 9, 10; q4 = 4 ->
  // bit 14; q5 = 5 -> bits 15, 17; q6 = 6 -> bits 19, 20; q7 = 7 -> 21..23; q8 = 7 -> 24..26.
  const std::vector<uint8_t> want = {0x88, 0xC6, 0xFA, 0x07, 0x47, 0xBC, 0x8A, 0x38};
  EXPECT_EQ(q.weight, want);
}

TEST(Packing, Int3DecodesHandWrittenBytes) {
  const std::vector<uint8_t> codes = {0x88, 0xC6, 0xFA, 0x07};  // q = 0 1 2 3 4 5 6 7 7 0
  const float scale = 0.5f;
  FcWeights w;
  w.weight = TensorView(codes.data(), DType::kU8, {1, 1, 4});
  w.scales = TensorView(&scale, DType::kF32, {1, 1});
  const FcFormat f = make_format(WeightFormat::kInt3, 0);
  float out[10];
  dequantize_row<float>(f, w, 1, 10, 0, 0, out);
  const float want[10] = {-2, -1.5f, -1, -0.5f, 0, 0.5f, 1, 1.5f, 1.5f, -2};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(out[i], want[i]) << i;
}

TEST(Packing, PerChannelZeroPointsPackAlongN) {
  // int4 asymmetric: each row spans 15 (scale 1) with lo = -3, -10, -7 -> zp 3, 10, 7.
  std::vector<float> w(3 * 16, 0.0f);
  w[0] = -3, w[1] = 12;
  w[16] = -10, w[17] = 5;
  w[32] = -7, w[33] = 8;
  const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt4, 0, true), w, 1, 3, 16);
  const std::vector<uint8_t> want_zp = {0xA3, 0x07};  // 3 | 10 << 4, then 7 and a zero nibble
  EXPECT_EQ(q.zero_points, want_zp);
  EXPECT_EQ(q.weight[0], 0xF0);  // row 0: -3 -> 0, 12 -> 15
  EXPECT_EQ(q.weight[8], 0xF0);  // row 1: -10 -> 0, 5 -> 15
  for (int r = 0; r < 3; ++r) EXPECT_EQ(scale_at(q, r), 1.0f);
}

TEST(Packing, BlockedZeroPointsPackAlongBlocks) {
  {  // int2 b16, 5 blocks: ranges [0, 3], [-1, 2], [-2, 1], [-3, 0], [-1, 2] -> zp 0 1 2 3 1.
    std::vector<float> w(80, 0.0f);
    const float lo[5] = {0, -1, -2, -3, -1};
    for (int b = 0; b < 5; ++b) {
      w[b * 16] = lo[b];
      w[b * 16 + 1] = lo[b] + 3;
    }
    const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt2, 16, true), w, 1, 1, 80);
    const std::vector<uint8_t> want = {0xE4, 0x01};  // 0 | 1 << 2 | 2 << 4 | 3 << 6, then 1
    EXPECT_EQ(q.zero_points, want);
  }
  {  // int3 b16, 3 blocks with zp 5, 2, 7: 5 | 2 << 3 | 7 << 6 = 0x1D5 crosses into byte 1.
    std::vector<float> w(48, 0.0f);
    const float lo[3] = {-5, -2, -7};
    for (int b = 0; b < 3; ++b) {
      w[b * 16] = lo[b];
      w[b * 16 + 1] = lo[b] + 7;
    }
    const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt3, 16, true), w, 1, 1, 48);
    const std::vector<uint8_t> want = {0xD5, 0x01};
    EXPECT_EQ(q.zero_points, want);
  }
  {  // int8: one zero point per byte.
    std::vector<float> w(32, 0.0f);
    w[0] = -51, w[1] = 204;  // span 255 -> scale 1, zp 51
    w[16] = -200, w[17] = 55;
    const QuantizedFc q = quantize_or_die(make_format(WeightFormat::kInt8, 16, true), w, 1, 1, 32);
    const std::vector<uint8_t> want = {51, 200};
    EXPECT_EQ(q.zero_points, want);
  }
}

// The E2M1 values in code order 0..15 then 7 again: every block's amax is 6.
const float kFp4Row[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, 6};
const std::vector<uint8_t> kFp4RowBytes = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0x7E};

TEST(Packing, Fp4KPackedLowNibbleIsEvenK) {
  std::vector<float> w(kFp4Row, kFp4Row + 16);
  // nvfp4: g = 6 / 2688, block scale e4m3(6 / 6 / g) = 448 (0x7E), w / (448 g) ~ w.
  QuantizedFc q = quantize_or_die(default_fc_format(WeightFormat::kNvFp4), w, 1, 1, 16);
  EXPECT_EQ(q.weight, kFp4RowBytes);
  EXPECT_EQ(q.scales, std::vector<uint8_t>{0x7E});
  EXPECT_EQ(q.global_scale[0], 6.0f / 2688.0f);
  // mxfp4: amax 6 -> 2^round(log2(6 / 6)) = 2^0, code 127; g = 1.
  w.insert(w.end(), kFp4Row, kFp4Row + 16);
  q = quantize_or_die(default_fc_format(WeightFormat::kMxFp4), w, 1, 1, 32);
  std::vector<uint8_t> want = kFp4RowBytes;
  want.insert(want.end(), kFp4RowBytes.begin(), kFp4RowBytes.end());
  EXPECT_EQ(q.weight, want);
  EXPECT_EQ(q.scales, std::vector<uint8_t>{127});
  EXPECT_EQ(q.global_scale[0], 1.0f);
}

TEST(Packing, Fp4NPackedHoldsTwoRowsPerByte) {
  // Row 0 = the codes above, row 1 = the same negated (codes ^ 8, except 6 stays positive).
  std::vector<float> w(kFp4Row, kFp4Row + 16);
  for (float v : kFp4Row) w.push_back(-v);
  w[16 + 15] = 6;  // keep the block amax at 6 with a positive code
  FcFormat f = default_fc_format(WeightFormat::kNvFp4);
  f.fp4_layout = Fp4Layout::kNPacked;
  const QuantizedFc q = quantize_or_die(f, w, 1, 2, 16);
  ASSERT_EQ(q.weight.size(), 16u);  // [K = 16, N / 2 = 1]
  for (int k = 0; k < 16; ++k) {
    const unsigned c0 = (kFp4RowBytes[k / 2] >> (4 * (k & 1))) & 15u;
    const unsigned c1 = k == 15 ? 7u : c0 ^ 8u;
    EXPECT_EQ(q.weight[k], static_cast<uint8_t>(c0 | (c1 << 4))) << "k " << k;
  }
}

TEST(Packing, Fp8CodesAndGlobalScale) {
  const std::vector<float> w = {448, 1, -0.5f, 0, 0.001953125f, -448, 0.0625f, 3.0f};
  const QuantizedFc q = quantize_or_die(default_fc_format(WeightFormat::kFp8), w, 1, 1, 8);
  const std::vector<uint8_t> want = {0x7E, 0x38, 0xB0, 0x00, 0x01, 0xFE, 0x18, 0x44};
  EXPECT_EQ(q.weight, want);
  EXPECT_EQ(q.global_scale[0], 1.0f);
}

TEST(Packing, Fp8BlockScalesCoverPartialBlocks) {
  const int64_t n = 5, k = 7,
                bs = 4;  // scales [1, 2, 2]; the last row and column blocks are partial
  const std::vector<float> w = test::gaussian(n * k, test::fresh_seed());
  for (DType sd : {DType::kF32, DType::kBF16}) {
    const QuantizedFc q =
        quantize_or_die(make_format(WeightFormat::kFp8Block, bs, false, sd), w, 1, n, k);
    ASSERT_EQ(q.scales.size(), 4 * dtype_size(sd));
    for (int bn = 0; bn < 2; ++bn) {
      for (int bk = 0; bk < 2; ++bk) {
        float amax = 0;
        for (int64_t r = bn * bs; r < std::min(n, (bn + 1) * bs); ++r) {
          for (int64_t c = bk * bs; c < std::min(k, (bk + 1) * bs); ++c) {
            amax = std::max(amax, std::fabs(w[r * k + c]));
          }
        }
        EXPECT_EQ(scale_at(q, bn * 2 + bk), round_to(sd, amax / 448.0f)) << bn << "," << bk;
      }
    }
  }
}

}  // namespace
}  // namespace qmoe

// Weight formats: the traits table, tensor shapes and checks, raw layouts (bitwise against
// hand-computed bytes), quantizers against the documented formulas, the exactness of the float
// dequantizer against the fp64 one, error budgets, and the fp4 repacking.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "qmoe/format.h"
#include "qmoe/quantize.h"
#include "test_util.h"

namespace qmoe {
namespace {

// ---- the format list and every configuration it allows ----

const std::vector<WeightFormat>& all_formats() {
  static const std::vector<WeightFormat> v = {
#define QMOE_X(id, ...) WeightFormat::id,
      QMOE_WEIGHT_FORMATS(QMOE_X)
#undef QMOE_X
  };
  return v;
}

// Block sizes to exercise per rule. fp8_block: a partial-edge size, a non-power of two and the
// DeepSeek size (1x1 blocks are near exact, so the error-floor test could not run on them).
std::vector<int> test_blocks(const FormatInfo& fi) {
  switch (fi.block_rule) {
    case BlockRule::kIntBlocks:
      return {0, 16, 32, 64, 128, 256};
    case BlockRule::kFixed:
      return {fi.default_block};
    case BlockRule::kNone:
      return {0};
    case BlockRule::kSquare:
      return {7, 100, 128};
  }
  return {};
}

std::vector<DType> test_scale_dtypes(const FormatInfo& fi) {
  const bool float_scales = fi.kind == FormatKind::kInteger || fi.block_rule == BlockRule::kSquare;
  if (float_scales) return {DType::kF32, DType::kF16, DType::kBF16};
  return {default_fc_format(fi.id).scale_dtype};
}

// Every format x allowed block x zero points x scale dtype (x fp4 layout).
std::vector<FcFormat> all_configs() {
  std::vector<FcFormat> out;
  for (WeightFormat wf : all_formats()) {
    const FormatInfo& fi = format_info(wf);
    for (int bs : test_blocks(fi)) {
      for (int zp = 0; zp <= (fi.zero_points_allowed ? 1 : 0); ++zp) {
        for (DType sd : test_scale_dtypes(fi)) {
          for (int lay = 0; lay < (fi.kind == FormatKind::kFp4 ? 2 : 1); ++lay) {
            FcFormat f = default_fc_format(wf);
            f.block_size = bs;
            f.zero_points = zp != 0;
            f.scale_dtype = sd;
            f.fp4_layout = lay ? Fp4Layout::kNPacked : Fp4Layout::kKPacked;
            out.push_back(f);
          }
        }
      }
    }
  }
  return out;
}

FcFormat make_format(WeightFormat wf, int block, bool zp = false, DType sd = DType::kF32) {
  FcFormat f = default_fc_format(wf);
  f.block_size = block;
  f.zero_points = zp;
  if (f.info().kind != FormatKind::kFp4 || sd != DType::kF32) f.scale_dtype = sd;  // fp4: native
  return f;
}

// Code idx of an LSB-first bitstream, read one bit at a time (independent of the library's reader).
unsigned bits_at(const uint8_t* p, int64_t idx, int bits) {
  unsigned v = 0;
  for (int t = 0; t < bits; ++t) {
    const int64_t j = idx * bits + t;
    v |= ((p[j / 8] >> (j % 8)) & 1u) << t;
  }
  return v;
}

float scale_at(const QuantizedFc& q, int64_t i) {
  switch (q.format.scale_dtype) {
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, q.scales.data() + 2 * i, 2);
      return num::f16_to_f32(h);
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, q.scales.data() + 2 * i, 2);
      return num::bf16_to_f32(h);
    }
    case DType::kF8E4M3:
      return num::e4m3_to_f32(q.scales[i]);
    case DType::kF8E8M0:
      return num::e8m0_to_f32(q.scales[i]);
    default: {
      float f;
      std::memcpy(&f, q.scales.data() + 4 * i, 4);
      return f;
    }
  }
}

float round_to(DType t, float s) {
  switch (t) {
    case DType::kF16:
      return num::f16_to_f32(num::f32_to_f16(s));
    case DType::kBF16:
      return num::bf16_to_f32(num::f32_to_bf16(s));
    default:
      return s;
  }
}

QuantizedFc quantize_or_die(const FcFormat& f, const std::vector<float>& w, int64_t e, int64_t n,
                            int64_t k) {
  QuantizedFc q;
  const Status st = quantize_fc(f, w.data(), e, n, k, &q);
  EXPECT_TRUE(st.is_ok()) << f.to_string() << ": " << st.to_string();
  return q;
}

std::vector<float> dequantize_all(const QuantizedFc& q) {
  std::vector<float> out(static_cast<size_t>(q.experts * q.n * q.k));
  const Status st = dequantize_fc(q.format, q.view(), q.experts, q.n, q.k, out.data());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

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

// Settings read once at prepare: resolve_prepare_options() applies each QMOE_* variable where its
// field holds the default, checks every field and value with an error naming the variable or field
// and what it expects; force_dispatch()'s check names the choice and the layer's choices.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "layer_factory.h"
#include "qmoe/backend.h"
#include "qmoe/tuning.h"

namespace qmoe::test {
namespace {

// Every variable resolve_prepare_options reads.
const char* const kVariables[] = {
    "QMOE_TUNE_FILE",         "QMOE_GEMM",         "QMOE_DISPATCH",
    "QMOE_CUDA_PATH",         "QMOE_PDL",          "QMOE_DECODE_ROWS",
    "QMOE_DECODE_TPB",        "QMOE_DECODE_RING",  "QMOE_DECODE_PREFETCH",
    "QMOE_DECODE_MIN_BLOCKS", "QMOE_FUSED_GRID",   "QMOE_MIXED_TILE",
    "QMOE_ACT_QUANT",         "QMOE_EPILOGUE_ACT", "QMOE_DECODE_COMBINE"};

// Each test starts from an environment without them (restored afterwards).
class PrepareOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVariables) cleared_.push_back(std::make_unique<EnvOverride>(v, nullptr));
  }
  void TearDown() override { cleared_.clear(); }

 private:
  std::vector<std::unique_ptr<EnvOverride>> cleared_;
};

Status resolve(const PrepareOptions& in, PrepareOptions* out) {
  return resolve_prepare_options(in, out);
}

void expect_decode(const DecodeOptions& d, int rows, int tiles_per_block, int ring, int prefetch,
                   int min_blocks, int combine = -1) {
  EXPECT_EQ(d.combine, combine);
  EXPECT_EQ(d.rows, rows);
  EXPECT_EQ(d.tiles_per_block, tiles_per_block);
  EXPECT_EQ(d.ring, ring);
  EXPECT_EQ(d.prefetch, prefetch);
  EXPECT_EQ(d.min_blocks, min_blocks);
}

TEST_F(PrepareOptionsTest, DefaultsStayWithoutTheEnvironment) {
  PrepareOptions in, out;
  in.num_threads = 3;
  in.max_dequant_bytes = 12345;
  ASSERT_TRUE(resolve(in, &out).is_ok());
  EXPECT_EQ(out.num_threads, 3);
  EXPECT_EQ(out.max_dequant_bytes, 12345u);
  EXPECT_EQ(out.tune_file, "");
  EXPECT_EQ(out.gemm, "");
  EXPECT_EQ(out.dispatch, "");
  EXPECT_TRUE(out.pdl);
  EXPECT_TRUE(out.epilogue_act);
  EXPECT_EQ(out.act_quant, "none");
  // The documented defaults (the measured choices), unchanged.
  expect_decode(DecodeOptions{}, -1, 0, 0, -1, 4);
  expect_decode(out.decode, -1, 0, 0, -1, 4);
}

TEST_F(PrepareOptionsTest, VariablesApplyWhereFieldsHoldTheirDefaults) {
  EnvOverride a("QMOE_TUNE_FILE", "/tmp/t.json"), b("QMOE_GEMM", "mma"),
      c("QMOE_DISPATCH", "fused"), d("QMOE_PDL", "0"), e("QMOE_DECODE_ROWS", "3"),
      f("QMOE_DECODE_TPB", "8"), g("QMOE_DECODE_RING", "2"), h("QMOE_DECODE_PREFETCH", "0"),
      i("QMOE_DECODE_MIN_BLOCKS", "0"), j("QMOE_FUSED_GRID", "5"), k("QMOE_MIXED_TILE", "32"),
      l("QMOE_EPILOGUE_ACT", "0");
  PrepareOptions out;
  ASSERT_TRUE(resolve({}, &out).is_ok());
  EXPECT_FALSE(out.epilogue_act);
  EXPECT_EQ(out.fused_grid_ctas, 5);
  EXPECT_EQ(out.mixed_tile, 32);
  EXPECT_EQ(out.tune_file, "/tmp/t.json");
  EXPECT_EQ(out.gemm, "mma");
  EXPECT_EQ(out.dispatch, "fused");
  EXPECT_FALSE(out.pdl);
  expect_decode(out.decode, 3, 8, 2, 0, 0);

  // A caller's own choice wins over the variable.
  PrepareOptions mine;
  mine.tune_file = "mine.json";
  mine.gemm = "cutlass";
  mine.dispatch = "generic";
  mine.pdl = false;
  mine.decode =
      DecodeOptions{5, 4, 1, 2, 2, 3};  // rows, tiles, ring, prefetch, min blocks, combine
  mine.fused_grid_ctas = 3;
  mine.mixed_tile = 128;
  ASSERT_TRUE(resolve(mine, &out).is_ok());
  EXPECT_EQ(out.mixed_tile, 128);
  EXPECT_EQ(out.tune_file, "mine.json");
  EXPECT_EQ(out.gemm, "cutlass");
  EXPECT_EQ(out.dispatch, "generic");
  EXPECT_FALSE(out.pdl);
  expect_decode(out.decode, 5, 4, 1, 2, 2, 3);
  EXPECT_EQ(out.fused_grid_ctas, 3);
}

// Resolved options resolve to themselves (the CLI resolves once, then prepares with the result),
// whatever the environment still says.
TEST_F(PrepareOptionsTest, ResolvingTwiceChangesNothing) {
  EnvOverride a("QMOE_GEMM", "cutlass-dequant"), b("QMOE_DISPATCH", "generic"), c("QMOE_PDL", "0"),
      d("QMOE_DECODE_ROWS", "3"), e("QMOE_DECODE_TPB", "8"), f("QMOE_MIXED_TILE", "64"),
      g("QMOE_ACT_QUANT", "fp8_e4m3"), h("QMOE_FUSED_GRID", "7"), i("QMOE_EPILOGUE_ACT", "0"),
      j("QMOE_DECODE_COMBINE", "0");
  PrepareOptions once, twice;
  ASSERT_TRUE(resolve({}, &once).is_ok());
  ASSERT_TRUE(resolve(once, &twice).is_ok());
  EXPECT_FALSE(twice.epilogue_act);
  EXPECT_EQ(twice.gemm, "cutlass-dequant");
  EXPECT_EQ(twice.dispatch, "generic");
  EXPECT_FALSE(twice.pdl);
  EXPECT_EQ(twice.mixed_tile, 64);
  EXPECT_EQ(twice.act_quant, "fp8_e4m3");
  EXPECT_EQ(twice.fused_grid_ctas, 7);
  expect_decode(twice.decode, once.decode.rows, once.decode.tiles_per_block, once.decode.ring,
                once.decode.prefetch, once.decode.min_blocks, once.decode.combine);
  EXPECT_EQ(twice.decode.combine, 0);
  EXPECT_EQ(twice.decode.rows, 3);
  EXPECT_EQ(twice.decode.tiles_per_block, 8);
}

TEST_F(PrepareOptionsTest, OlderCudaPathSpelling) {
  PrepareOptions out;
  {
    EnvOverride o("QMOE_CUDA_PATH", "generic");
    ASSERT_TRUE(resolve({}, &out).is_ok());
    EXPECT_EQ(out.dispatch, "generic");
    EnvOverride n("QMOE_DISPATCH", "decode/1");  // the newer name wins
    ASSERT_TRUE(resolve({}, &out).is_ok());
    EXPECT_EQ(out.dispatch, "decode/1");
  }
  EnvOverride other("QMOE_CUDA_PATH", "decode");  // never meant anything
  ASSERT_TRUE(resolve({}, &out).is_ok());
  EXPECT_EQ(out.dispatch, "");
}

TEST_F(PrepareOptionsTest, EmptyVariablesAreUnset) {
  EnvOverride a("QMOE_DECODE_TPB", ""), b("QMOE_DISPATCH", ""), c("QMOE_PDL", "");
  PrepareOptions out;
  ASSERT_TRUE(resolve({}, &out).is_ok());
  EXPECT_EQ(out.decode.tiles_per_block, 0);
  EXPECT_EQ(out.dispatch, "");
  EXPECT_TRUE(out.pdl);
}

// Junk that atoi would have taken as some number: each refused, naming the variable, quoting the
// value and saying what was expected.
TEST_F(PrepareOptionsTest, BadVariablesAreNamed) {
  struct Case {
    const char* var;
    const char* value;
    const char* expected;  // a piece of the message
  };
  for (const Case& c :
       {Case{"QMOE_PDL", "yes", "0 or 1"}, Case{"QMOE_PDL", "2", "0 or 1"},
        Case{"QMOE_DECODE_ROWS", "4x", "row count"},
        Case{"QMOE_DECODE_ROWS", "-2", "-1 (automatic)"},
        Case{"QMOE_DECODE_TPB", "3", "multiple of 4"},
        Case{"QMOE_DECODE_TPB", " 8", "multiple of 4"},
        Case{"QMOE_DECODE_TPB", "99999999999999999999", "multiple of 4"},
        Case{"QMOE_DECODE_RING", "3", "shared memory"}, Case{"QMOE_DECODE_PREFETCH", "17", "0..16"},
        Case{"QMOE_DECODE_MIN_BLOCKS", "-1", "1..32"},
        Case{"QMOE_DECODE_COMBINE", "65", "1..64 tokens"},
        Case{"QMOE_GEMM", "cublas", "cutlass-dequant"},
        Case{"QMOE_DISPATCH", "decode/3", "generic/64, generic/128 or generic/144"},
        Case{"QMOE_DISPATCH", "decode/2", "decode/1"},      // the deleted two-group form
        Case{"QMOE_DISPATCH", "generic/48", "generic/64"},  // a tile there is not
        Case{"QMOE_FUSED_GRID", "-1", "CTA count"},
        Case{"QMOE_MIXED_TILE", "48", "32, 64, 128 or 144"},
        Case{"QMOE_MIXED_TILE", "-32", "32, 64, 128 or 144"},
        Case{"QMOE_MIXED_TILE", "256", "32, 64, 128 or 144"}}) {  // the deleted 256-row tile
    EnvOverride o(c.var, c.value);
    PrepareOptions out;
    out.decode.rows = 77;  // untouched on error
    const Status st = resolve({}, &out);
    ASSERT_FALSE(st.is_ok()) << c.var << "=" << c.value;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    const std::string m = st.message();
    EXPECT_EQ(m.find(c.var), 0u) << m;
    EXPECT_NE(m.find(std::string("'") + c.value + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(c.expected), std::string::npos) << m;
    EXPECT_EQ(out.decode.rows, 77);
  }
}

// Tiles per block: 1 and 2 split each tile's K, multiples of 4 give each warp tiles; 3 and 6 are
// neither.
TEST_F(PrepareOptionsTest, TilesPerBlockTakesOneTwoAndMultiplesOfFour) {
  for (int tpb : {1, 2, 4, 8, 16}) {
    PrepareOptions in, out;
    in.decode.tiles_per_block = tpb;
    ASSERT_TRUE(resolve(in, &out).is_ok()) << tpb;
    EXPECT_EQ(out.decode.tiles_per_block, tpb);
  }
  for (int tpb : {3, 5, 6}) {
    PrepareOptions in, out;
    in.decode.tiles_per_block = tpb;
    const Status st = resolve(in, &out);
    ASSERT_FALSE(st.is_ok()) << tpb;
    EXPECT_NE(st.message().find("1, 2 or a positive multiple of 4"), std::string::npos)
        << st.message();
  }
  EnvOverride v("QMOE_DECODE_TPB", "2");
  PrepareOptions out;
  ASSERT_TRUE(resolve({}, &out).is_ok());
  EXPECT_EQ(out.decode.tiles_per_block, 2);
}

TEST_F(PrepareOptionsTest, BadFieldsAreNamed) {
  struct Case {
    void (*set)(PrepareOptions*);
    const char* field;
  };
  for (const Case& c : {
           Case{[](PrepareOptions* o) { o->decode.rows = -5; }, "decode.rows"},
           Case{[](PrepareOptions* o) { o->decode.tiles_per_block = 6; }, "decode.tiles_per_block"},
           Case{[](PrepareOptions* o) { o->decode.tiles_per_block = -4; },
                "decode.tiles_per_block"},
           Case{[](PrepareOptions* o) { o->decode.ring = -1; }, "decode.ring"},
           Case{[](PrepareOptions* o) { o->decode.prefetch = 100; }, "decode.prefetch"},
           Case{[](PrepareOptions* o) { o->decode.min_blocks = 33; }, "decode.min_blocks"},
           Case{[](PrepareOptions* o) { o->decode.combine = -2; }, "decode.combine"},
           Case{[](PrepareOptions* o) { o->gemm = "fast"; }, "gemm"},
           Case{[](PrepareOptions* o) { o->dispatch = "decode"; }, "dispatch"},
           Case{[](PrepareOptions* o) { o->fused_grid_ctas = -2; }, "fused_grid_ctas"},
           Case{[](PrepareOptions* o) { o->mixed_tile = 96; }, "mixed_tile"},
           Case{[](PrepareOptions* o) { o->mixed_tile = 256; }, "mixed_tile"},
       }) {
    PrepareOptions in, out;
    c.set(&in);
    const Status st = resolve(in, &out);
    ASSERT_FALSE(st.is_ok()) << c.field;
    EXPECT_EQ(st.message().find(std::string(c.field) + ": expected"), 0u) << st.message();
  }
  // The edges that are valid.
  PrepareOptions in, out;
  in.decode = DecodeOptions{0, 1, 2, 16, 32, 64};
  EXPECT_TRUE(resolve(in, &out).is_ok());
  in.decode.tiles_per_block = 64;
  EXPECT_TRUE(resolve(in, &out).is_ok());
  EXPECT_FALSE(resolve_prepare_options(in, nullptr).is_ok());
}

// The CPU backend reads none of these settings: a bad CUDA variable does not stop its prepare.
TEST_F(PrepareOptionsTest, CpuBackendIgnoresCudaSettings) {
  EnvOverride o("QMOE_DECODE_TPB", "junk");
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kInt4), fresh_seed(), &tl);
  std::unique_ptr<PreparedLayer> layer;
  EXPECT_TRUE(prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, {}, &layer).is_ok());
}

// act_quant: "none" (the default) or "fp8_e4m3", from the field or QMOE_ACT_QUANT; the CPU
// backend, the exact one, takes "none" only.
TEST_F(PrepareOptionsTest, ActQuantValuesAndTheCpuBackend) {
  PrepareOptions in, out;
  in.act_quant = "fp8_e4m3";
  ASSERT_TRUE(resolve(in, &out).is_ok());
  EXPECT_EQ(out.act_quant, "fp8_e4m3");
  in.act_quant = "int8";
  Status st = resolve(in, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("act_quant: expected none or fp8_e4m3, got 'int8'"),
            std::string::npos)
      << st.to_string();
  {
    EnvOverride v("QMOE_ACT_QUANT", "fp8_e4m3");
    ASSERT_TRUE(resolve({}, &out).is_ok());
    EXPECT_EQ(out.act_quant, "fp8_e4m3");
  }
  {
    EnvOverride v("QMOE_ACT_QUANT", "fp8");
    st = resolve({}, &out);
    EXPECT_NE(st.message().find("QMOE_ACT_QUANT"), std::string::npos) << st.to_string();
  }
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kFp8Block), 7, &tl);
  std::unique_ptr<PreparedLayer> layer;
  PrepareOptions fp8;
  fp8.act_quant = "fp8_e4m3";
  st = prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, fp8, &layer);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("act_quant"), std::string::npos) << st.to_string();
  EXPECT_EQ(layer, nullptr);
  fp8.act_quant = "none";
  EXPECT_TRUE(prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, fp8, &layer).is_ok());
}

TEST(ForceDispatch, ChecksTheChoiceAgainstTheLayers) {
  const std::vector<std::string> decode = {"generic", "decode/1", "fused"};
  EXPECT_TRUE(check_forced_choice("", decode).is_ok());
  EXPECT_TRUE(check_forced_choice("fused", decode).is_ok());
  EXPECT_TRUE(check_forced_choice("", {}).is_ok());
  EXPECT_FALSE(check_forced_choice("decode/cc", decode).is_ok());  // the deleted CUDA-core form
  EXPECT_FALSE(check_forced_choice("decode/2", decode).is_ok());   // the deleted two-group form

  Status st = check_forced_choice("decode/7", decode);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "force_dispatch: expected generic, decode/1 or fused, or \"\" for the "
            "dispatch table, got 'decode/7'");
  st = check_forced_choice("fused", {"generic", "decode/1"});  // a name, not this layer's
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'fused' is not a path"), std::string::npos) << st.message();

  st = check_forced_choice("decode/1", {"generic"});  // a name, but not this layer's
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'decode/1' is not a path of this layer"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("generic, or \"\""), std::string::npos) << st.message();

  EXPECT_EQ(dispatch_choice_list(),
            "generic, decode/1, fused, generic/32, generic/64, generic/128 or generic/144");
  // A tile choice is a name, so on a layer without the tiles it is "not a path of this layer".
  st = check_forced_choice("generic/64", decode);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'generic/64' is not a path of this layer"), std::string::npos)
      << st.message();
}

// The CPU backend has one path: "" is the only choice, and it says so.
TEST(ForceDispatch, CpuLayerHasOnePath) {
  TestLayer tl;
  make_layer(small_spec(WeightFormat::kInt4), fresh_seed(), &tl);
  std::unique_ptr<PreparedLayer> layer;
  ASSERT_TRUE(prepare_layer(BackendKind::kCpu, tl.spec, tl.weights, {}, &layer).is_ok());
  EXPECT_TRUE(layer->force_dispatch("").is_ok());
  const Status st = layer->force_dispatch("generic");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("one path"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("'generic'"), std::string::npos) << st.message();
  EXPECT_TRUE(layer->dispatch_candidates(1).empty());
}

}  // namespace
}  // namespace qmoe::test

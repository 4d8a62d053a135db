// layer_from_ort: ORT QMoE attributes and raw inputs map 1:1 onto LayerSpec/LayerWeights, and every
// input the import cannot honour is named in its error.
#include <gtest/gtest.h>

#include <string>

#include "layer_factory.h"
#include "qmoe/ort.h"

namespace qmoe::test {
namespace {

struct OrtCase {
  TestLayer tl;
  TestInputs ti;
  OrtQMoEAttributes attrs;
  TensorView inputs[kNumOrtInputs];
};

void make_ort_case(const LayerSpec& spec, OrtCase* c) {
  const uint64_t seed = fresh_seed();
  make_layer(spec, seed, &c->tl);
  make_inputs(c->tl.spec, 3, seed, false, &c->ti);
  const LayerWeights& w = c->tl.weights;
  c->inputs[kOrtInput] = c->ti.in.input;
  c->inputs[kOrtRouterProbs] = c->ti.in.router_logits;
  c->inputs[kOrtFc1Weights] = w.fc1.weight;
  c->inputs[kOrtFc1Scales] = w.fc1.scales;
  c->inputs[kOrtFc1Bias] = w.fc1.bias;
  c->inputs[kOrtFc1ZeroPoints] = w.fc1.zero_points;
  c->inputs[kOrtFc1GlobalScale] = w.fc1.global_scale;
  c->inputs[kOrtFc2Weights] = w.fc2.weight;
  c->inputs[kOrtFc2Scales] = w.fc2.scales;
  c->inputs[kOrtFc2Bias] = w.fc2.bias;
  c->inputs[kOrtFc2ZeroPoints] = w.fc2.zero_points;
  c->inputs[kOrtFc2GlobalScale] = w.fc2.global_scale;
  c->inputs[kOrtFc3Weights] = w.fc3.weight;
  c->inputs[kOrtFc3Scales] = w.fc3.scales;
  c->inputs[kOrtFc3ZeroPoints] = w.fc3.zero_points;
  c->attrs.k = spec.routing.top_k;
  c->attrs.activation_type = activation_name(spec.activation.kind);
  c->attrs.swiglu_fusion = static_cast<int>(spec.activation.glu);
  c->attrs.normalize_routing_weights = spec.routing.normalize;
  c->attrs.weights_prepacked = 0;
  const FormatInfo& fi = spec.fc1.info();
  c->attrs.quant_type = fi.ort_quant_type;
  c->attrs.block_size = spec.fc1.block_size;
  if (fi.kind == FormatKind::kInteger) {
    c->attrs.expert_weight_bits = spec.fc1.bits();
    c->attrs.fc2_expert_weight_bits = spec.fc2.bits();
  }
  if (fi.kind == FormatKind::kFp4) c->attrs.weights_prepacked = -1;  // ORT's N-packed layout
}

TEST(OrtImport, IntegerLayerMapsOneToOne) {
  LayerSpec spec = small_spec(WeightFormat::kInt4);
  spec.fc2 = default_fc_format(WeightFormat::kInt2);
  spec.fc2.block_size = spec.fc1.block_size;  // ORT has one block_size for every FC
  spec.fc1.zero_points = true;
  spec.has_fc1_bias = true;
  OrtCase c;
  make_ort_case(spec, &c);
  LayerSpec got;
  LayerWeights w;
  Status st = layer_from_ort(c.attrs, c.inputs, {}, &got, &w);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(got.hidden, spec.hidden);
  EXPECT_EQ(got.inter, spec.inter);
  EXPECT_EQ(got.num_experts, spec.num_experts);
  EXPECT_EQ(got.fc1.format, WeightFormat::kInt4);
  EXPECT_TRUE(got.fc1.zero_points);
  EXPECT_EQ(got.fc2.format, WeightFormat::kInt2);
  EXPECT_EQ(got.fc1.block_size, spec.fc1.block_size);
  EXPECT_EQ(got.routing.method, RoutingMethod::kSoftmaxTopK);
  EXPECT_TRUE(got.routing.normalize);
  EXPECT_TRUE(got.has_fc1_bias);
  EXPECT_EQ(w.fc1.weight.data, c.inputs[kOrtFc1Weights].data);

  OrtImportOptions cpu;
  cpu.semantics = OrtSemantics::kCpu;
  ASSERT_TRUE(layer_from_ort(c.attrs, c.inputs, cpu, &got, &w).is_ok());
  EXPECT_EQ(got.routing.method, RoutingMethod::kTopKSoftmax);
  EXPECT_EQ(got.routing.ties, TieBreak::kHigherIndex);
}

TEST(OrtImport, WeightsOnlyLayerDerivesHiddenFromFc2) {
  for (WeightFormat f : {WeightFormat::kInt8, WeightFormat::kNvFp4, WeightFormat::kMxFp4,
                         WeightFormat::kFp8, WeightFormat::kFp8Block}) {
    LayerSpec spec = small_spec(f);
    if (f == WeightFormat::kNvFp4 || f == WeightFormat::kMxFp4) {
      spec.fc1.fp4_layout = spec.fc2.fp4_layout = Fp4Layout::kNPacked;
    }
    OrtCase c;
    make_ort_case(spec, &c);
    c.inputs[kOrtInput] = TensorView();
    c.inputs[kOrtRouterProbs] = TensorView();
    LayerSpec got;
    LayerWeights w;
    Status st = layer_from_ort(c.attrs, c.inputs, {}, &got, &w);
    ASSERT_TRUE(st.is_ok()) << format_info(f).name << ": " << st.to_string();
    EXPECT_EQ(got.hidden, spec.hidden) << format_info(f).name;
    EXPECT_EQ(got.inter, spec.inter) << format_info(f).name;
    EXPECT_EQ(got.fc1.format, f);
  }
}

// ORT accepts calls of zero tokens; an empty input may come with a null pointer (torch, DLPack)
// and still gives H and the activation dtype.
TEST(OrtImport, EmptyInputWithNullPointerGivesShapeAndDtype) {
  LayerSpec spec = small_spec(WeightFormat::kInt8);
  spec.act_dtype = DType::kBF16;
  OrtCase c;
  make_ort_case(spec, &c);
  c.inputs[kOrtInput] = TensorView(nullptr, DType::kBF16, {0, spec.hidden});
  c.inputs[kOrtRouterProbs] = TensorView(nullptr, DType::kBF16, {0, spec.num_experts});
  LayerSpec got;
  LayerWeights w;
  const Status st = layer_from_ort(c.attrs, c.inputs, {}, &got, &w);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(got.hidden, spec.hidden);
  EXPECT_EQ(got.act_dtype, DType::kBF16);
}

TEST(OrtImport, RejectsWhatItCannotHonour) {
  OrtCase c;
  make_ort_case(small_spec(WeightFormat::kInt4), &c);
  LayerSpec s;
  LayerWeights w;
  auto expect = [&](const OrtQMoEAttributes& a, const TensorView* in, const std::string& needle) {
    Status st = layer_from_ort(a, in, {}, &s, &w);
    EXPECT_FALSE(st.is_ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  OrtQMoEAttributes a = c.attrs;
  a.weights_prepacked = 1;
  expect(a, c.inputs, "weights_prepacked");
  a = c.attrs;
  a.quant_type = "int5";
  expect(a, c.inputs, "quant_type: expected int, fp4, nvfp4 or fp8");
  a = c.attrs;
  a.expert_weight_bits = 5;
  a.fc2_expert_weight_bits = -1;
  expect(a, c.inputs, "fc1_expert_weight_bits: expected 2, 3, 4 or 8, got 5");
  a = c.attrs;
  a.activation_type = "tanh";
  expect(a, c.inputs, "activation_type");
  a = c.attrs;
  a.k = 0;
  expect(a, c.inputs, "k: expected >= 1");
  a = c.attrs;
  a.k = 9;
  expect(a, c.inputs, "k: expected 1 <= k <= 8");
  a = c.attrs;
  a.swiglu_fusion = 0;  // separate FC3 needs fc3 inputs
  expect(a, c.inputs, "fc3_experts_weights: missing");
  a = c.attrs;
  a.block_size = 64;  // scales were made for 128
  expect(a, c.inputs, "fc1_scales: expected f32 [8, 256, 4]");

  TensorView in[kNumOrtInputs];
  for (int i = 0; i < kNumOrtInputs; ++i) in[i] = c.inputs[i];
  std::vector<float> wider(3 * 16);
  in[kOrtRouterProbs] =
      TensorView(wider.data(), DType::kF32, {3, 4});  // fewer columns than experts
  expect(c.attrs, in, "router_probs: has 4 expert columns but fc1_experts_weights holds 8");
  for (int i = 0; i < kNumOrtInputs; ++i) in[i] = c.inputs[i];
  in[kOrtFc1ActScale] = TensorView(wider.data(), DType::kF32, {1});
  expect(c.attrs, in, "fc1_act_scale");
}

TEST(OrtImport, AttributeMapRoundTrip) {
  OrtQMoEAttributes a;
  a.k = 4;
  a.activation_type = "swiglu";
  a.swiglu_fusion = 1;
  a.swiglu_limit = 7.0f;
  a.activation_alpha = 1.702f;
  a.activation_beta = 1.0f;
  a.fc2_expert_weight_bits = 2;
  a.block_size = 64;
  a.quant_type = "int";
  auto m = ort_attributes_to_map(a);
  m["qmoe.format_version"] = "1";
  OrtQMoEAttributes b;
  ASSERT_TRUE(ort_attributes_from_map(m, &b).is_ok());
  EXPECT_EQ(ort_attributes_to_map(b), ort_attributes_to_map(a));
  EXPECT_EQ(b.swiglu_limit, 7.0f);
  EXPECT_EQ(b.activation_alpha, 1.702f);
  EXPECT_EQ(ort_attributes_to_map(OrtQMoEAttributes())["swiglu_limit"], "inf");

  m["bogus"] = "1";
  Status st = ort_attributes_from_map(m, &b);
  EXPECT_NE(st.message().find("attribute 'bogus'"), std::string::npos) << st.message();
  m.erase("bogus");
  m["k"] = "four";
  st = ort_attributes_from_map(m, &b);
  EXPECT_NE(st.message().find("k: expected an integer, got 'four'"), std::string::npos);
}

}  // namespace
}  // namespace qmoe::test

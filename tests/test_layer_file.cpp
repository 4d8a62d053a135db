// Layer files: save -> load reproduces the spec and every tensor bitwise, for layers that exercise
// each metadata key; malformed files fail with an error naming the key or tensor.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "layer_factory.h"
#include "qmoe/io.h"
#include "test_util.h"

namespace qmoe {
namespace {

class LayerFileTest : public test::TempDirTest {
 protected:
  // Rewrites `from` into a new file with `edit` applied to its tensors and metadata.
  template <typename Edit>
  std::string rewrite(const std::string& from, Edit edit) {
    std::unique_ptr<SafetensorsFile> f;
    EXPECT_TRUE(SafetensorsFile::open(from, &f).is_ok());
    std::vector<NamedTensor> tensors;
    for (const auto& n : f->names()) tensors.push_back({n, *f->find(n)});
    std::map<std::string, std::string> meta = f->metadata();
    edit(&tensors, &meta);
    const std::string p = path("edited.safetensors");
    EXPECT_TRUE(write_safetensors(p, tensors, meta).is_ok());
    return p;
  }
  std::string saved_small_layer() {
    test::make_layer(test::small_spec(WeightFormat::kInt4), test::fresh_seed(), &layer_);
    const std::string p = path("small.safetensors");
    const Status s = save_layer_file(p, layer_.spec, layer_.weights);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return p;
  }

  test::TestLayer layer_;
};

void expect_same_format(const FcFormat& a, const FcFormat& b, const char* fc) {
  EXPECT_EQ(a.format, b.format) << fc;
  EXPECT_EQ(a.block_size, b.block_size) << fc;
  EXPECT_EQ(a.zero_points, b.zero_points) << fc;
  EXPECT_EQ(a.scale_dtype, b.scale_dtype) << fc;
  if (a.info().kind == FormatKind::kFp4) EXPECT_EQ(a.fp4_layout, b.fp4_layout) << fc;
}

void expect_same_spec(const LayerSpec& a, const LayerSpec& b) {
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.inter, b.inter);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.activation.kind, b.activation.kind);
  if (a.activation.gated()) EXPECT_EQ(a.activation.glu, b.activation.glu);
  EXPECT_EQ(a.activation.alpha, b.activation.alpha);
  EXPECT_EQ(a.activation.beta, b.activation.beta);
  EXPECT_EQ(a.activation.limit, b.activation.limit);
  EXPECT_EQ(a.activation.limit_after_activation, b.activation.limit_after_activation);
  const RoutingSpec &r = a.routing, &q = b.routing;
  EXPECT_EQ(r.method, q.method);
  EXPECT_EQ(r.top_k, q.top_k);
  EXPECT_EQ(r.normalize, q.normalize);
  EXPECT_EQ(r.ties, q.ties);
  EXPECT_EQ(r.num_shared, q.num_shared);
  EXPECT_EQ(r.shared_weight, q.shared_weight);
  EXPECT_EQ(r.sparse_mixer_eps, q.sparse_mixer_eps);
  EXPECT_EQ(r.n_group, q.n_group);
  EXPECT_EQ(r.topk_group, q.topk_group);
  EXPECT_EQ(r.routed_scaling_factor, q.routed_scaling_factor);
  EXPECT_EQ(r.combine, q.combine);
  expect_same_format(a.fc1, b.fc1, "fc1");
  expect_same_format(a.fc2, b.fc2, "fc2");
  EXPECT_EQ(a.has_fc3(), b.has_fc3());
  if (a.has_fc3()) expect_same_format(a.fc3, b.fc3, "fc3");
  EXPECT_EQ(a.has_fc1_bias, b.has_fc1_bias);
  EXPECT_EQ(a.has_fc2_bias, b.has_fc2_bias);
  EXPECT_EQ(a.has_fc3_bias, b.has_fc3_bias);
}

void expect_same_tensor(const TensorView& a, const TensorView& b, const std::string& name) {
  ASSERT_EQ(a.present(), b.present()) << name;
  if (!a.present()) return;
  EXPECT_EQ(a.dtype, b.dtype) << name;
  ASSERT_EQ(a.rank, b.rank) << name;
  for (int i = 0; i < a.rank; ++i) EXPECT_EQ(a.dims[i], b.dims[i]) << name;
  ASSERT_EQ(a.bytes(), b.bytes()) << name;
  EXPECT_EQ(std::memcmp(a.data, b.data, a.bytes()), 0) << name << " differs";
}

void expect_same_fc(const FcWeights& a, const FcWeights& b, const std::string& fc) {
  expect_same_tensor(a.weight, b.weight, fc + " weight");
  expect_same_tensor(a.scales, b.scales, fc + " scales");
  expect_same_tensor(a.bias, b.bias, fc + " bias");
  expect_same_tensor(a.zero_points, b.zero_points, fc + " zero_points");
  expect_same_tensor(a.global_scale, b.global_scale, fc + " global_scale");
}

struct RoundTripCase {
  const char* name;
  LayerSpec (*make)();
};

LayerSpec qwen_like() {
  LayerSpec s = test::small_spec(WeightFormat::kInt4);
  s.has_fc1_bias = s.has_fc2_bias = true;
  s.act_dtype = DType::kBF16;
  return s;
}

LayerSpec mixed_int_fc3() {
  LayerSpec s = test::small_spec(WeightFormat::kInt8);
  s.activation.glu = GluLayout::kSeparateFc3;
  s.fc1.block_size = s.fc2.block_size = s.fc3.block_size = 0;
  s.fc1.zero_points = s.fc3.zero_points = true;
  s.fc2 = default_fc_format(WeightFormat::kInt4);
  s.fc2.block_size = 0;
  s.fc2.scale_dtype = DType::kF16;
  s.fc3.format = WeightFormat::kInt2;
  s.has_fc3_bias = true;
  s.act_dtype = DType::kF16;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  s.routing.ties = TieBreak::kHigherIndex;
  s.routing.normalize = false;
  return s;
}

LayerSpec gpt_oss_like() {
  LayerSpec s = test::small_spec(WeightFormat::kMxFp4);
  s.activation.alpha = 1.702f;
  s.activation.beta = 1.0f;
  s.activation.limit = 7.0f;
  s.routing.method = RoutingMethod::kTopKSoftmax;
  s.routing.normalize = false;
  s.has_fc1_bias = s.has_fc2_bias = true;
  return s;
}

LayerSpec nvfp4_n_packed() {
  LayerSpec s = test::small_spec(WeightFormat::kNvFp4);
  s.fc1.fp4_layout = s.fc2.fp4_layout = Fp4Layout::kNPacked;
  s.activation.glu = GluLayout::kConcatenated;
  s.activation.limit_after_activation = true;
  s.activation.limit = 5.5f;
  return s;
}

LayerSpec deepseek_like() {
  LayerSpec s = test::small_spec(WeightFormat::kFp8Block, 256, 128, 16, 4);
  s.activation.glu = GluLayout::kSeparateFc3;
  s.fc2.scale_dtype = DType::kBF16;
  s.routing.method = RoutingMethod::kGroupedTopK;
  s.routing.n_group = 4;
  s.routing.topk_group = 2;
  s.routing.routed_scaling_factor = 2.5f;
  return s;
}

LayerSpec phi_like() {
  LayerSpec s = test::small_spec(WeightFormat::kFp8);
  s.routing.method = RoutingMethod::kSparseMixer;
  s.routing.sparse_mixer_eps = 0.03f;
  s.routing.normalize = false;
  return s;
}

LayerSpec llama4_like() {
  LayerSpec s = test::small_spec(WeightFormat::kInt3, 256, 128, 9, 1);
  s.fc1.block_size = s.fc2.block_size = 64;
  s.routing.num_shared = 1;
  s.routing.shared_weight = SharedWeight::kOne;
  s.routing.method = RoutingMethod::kTopKSigmoid;
  s.routing.normalize = false;
  s.routing.combine = CombineMode::kScaleInput;
  s.activation.glu = GluLayout::kConcatenated;
  return s;
}

LayerSpec geglu_relu_int2() {
  LayerSpec s = test::small_spec(WeightFormat::kInt2);
  s.fc1.block_size = s.fc2.block_size = 32;
  s.activation.kind = Activation::kGeGlu;
  return s;
}

LayerSpec relu_ungated() {
  LayerSpec s = test::small_spec(WeightFormat::kInt4);
  s.activation.kind = Activation::kRelu;
  s.has_fc2_bias = true;
  return s;
}

// Names the case in test listings instead of its bytes.
void PrintTo(const RoundTripCase& c, std::ostream* os) { *os << c.name; }

class LayerFileRoundTrip : public LayerFileTest,
                           public ::testing::WithParamInterface<RoundTripCase> {};

TEST_P(LayerFileRoundTrip, SpecAndTensorsSurvive) {
  test::TestLayer tl;
  test::make_layer(GetParam().make(), test::fresh_seed(), &tl);
  ASSERT_TRUE(check_layer(tl.spec, tl.weights).is_ok())
      << check_layer(tl.spec, tl.weights).to_string();
  const std::string p = path("layer.safetensors");
  const Status saved = save_layer_file(p, tl.spec, tl.weights);
  ASSERT_TRUE(saved.is_ok()) << saved.to_string();

  LoadedLayer loaded;
  const Status s = load_layer_file(p, &loaded);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  expect_same_spec(tl.spec, loaded.spec);
  if (tl.spec.has_fc1_bias || tl.spec.has_fc2_bias)
    EXPECT_EQ(loaded.spec.act_dtype, tl.spec.act_dtype);
  expect_same_fc(tl.weights.fc1, loaded.weights.fc1, "fc1");
  expect_same_fc(tl.weights.fc2, loaded.weights.fc2, "fc2");
  if (tl.spec.has_fc3()) expect_same_fc(tl.weights.fc3, loaded.weights.fc3, "fc3");
  expect_same_tensor(tl.weights.router_bias, loaded.weights.router_bias, "router_correction_bias");
}

INSTANTIATE_TEST_SUITE_P(Layers, LayerFileRoundTrip,
                         ::testing::Values(RoundTripCase{"qwen_like", qwen_like},
                                           RoundTripCase{"mixed_int_fc3", mixed_int_fc3},
                                           RoundTripCase{"gpt_oss_like", gpt_oss_like},
                                           RoundTripCase{"nvfp4_n_packed", nvfp4_n_packed},
                                           RoundTripCase{"deepseek_like", deepseek_like},
                                           RoundTripCase{"phi_like", phi_like},
                                           RoundTripCase{"llama4_like", llama4_like},
                                           RoundTripCase{"geglu_int2", geglu_relu_int2},
                                           RoundTripCase{"relu_ungated", relu_ungated}),
                         [](const ::testing::TestParamInfo<RoundTripCase>& i) {
                           return std::string(i.param.name);
                         });

TEST_F(LayerFileTest, UnknownQmoeKeyIsNamed) {
  const std::string p = rewrite(saved_small_layer(), [](auto*, auto* meta) {
    (*meta)["qmoe.routing_mehtod"] = "grouped_topk";
  });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("unknown key 'qmoe.routing_mehtod'"), std::string::npos)
      << s.message();
}

TEST_F(LayerFileTest, BadQmoeValueIsNamed) {
  const std::string p =
      rewrite(saved_small_layer(), [](auto*, auto* meta) { (*meta)["qmoe.tie_break"] = "left"; });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("qmoe.tie_break: expected lower or higher, got 'left'"),
            std::string::npos)
      << s.message();
}

TEST_F(LayerFileTest, BadSharedWeightIsNamed) {
  const std::string p = rewrite(saved_small_layer(),
                                [](auto*, auto* meta) { (*meta)["qmoe.shared_weight"] = "unit"; });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("qmoe.shared_weight: expected sigmoid or one, got 'unit'"),
            std::string::npos)
      << s.message();
}

TEST_F(LayerFileTest, UnknownAttributeIsNamed) {
  const std::string p =
      rewrite(saved_small_layer(), [](auto*, auto* meta) { (*meta)["top_k"] = "2"; });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'top_k'"), std::string::npos) << s.message();
}

TEST_F(LayerFileTest, UnsupportedVersion) {
  const std::string p =
      rewrite(saved_small_layer(), [](auto*, auto* meta) { (*meta)["qmoe.format_version"] = "2"; });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("qmoe.format_version"), std::string::npos) << s.message();
}

TEST_F(LayerFileTest, MissingRequiredTensorIsNamed) {
  for (const char* drop : {"fc2_scales", "fc1_experts_weights", "fc2_experts_weights"}) {
    const std::string p = rewrite(saved_small_layer(), [&](auto* tensors, auto*) {
      for (size_t i = 0; i < tensors->size(); ++i) {
        if ((*tensors)[i].name == drop) tensors->erase(tensors->begin() + i);
      }
    });
    LoadedLayer l;
    const Status s = load_layer_file(p, &l);
    ASSERT_FALSE(s.is_ok()) << drop;
    EXPECT_NE(s.message().find(drop), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
  }
}

TEST_F(LayerFileTest, UnexpectedTensorIsNamed) {
  const std::string p = rewrite(saved_small_layer(), [](auto* tensors, auto*) {
    tensors->push_back({"fc1_weight", tensors->front().view});
  });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("unexpected tensor 'fc1_weight'"), std::string::npos) << s.message();
}

TEST_F(LayerFileTest, PerCallInputInLayerFileIsRejected) {
  const std::string p = rewrite(saved_small_layer(), [](auto* tensors, auto*) {
    tensors->push_back({"router_probs", tensors->front().view});
  });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("'router_probs' is a per-call input"), std::string::npos)
      << s.message();
}

TEST_F(LayerFileTest, RouterBiasNeedsGroupedTopK) {
  static const float bias[8] = {};
  const std::string p = rewrite(saved_small_layer(), [](auto* tensors, auto*) {
    tensors->push_back({kRouterCorrectionBiasName, TensorView(bias, DType::kF32, {8})});
  });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("used only by grouped_topk"), std::string::npos) << s.message();
}

TEST_F(LayerFileTest, OrtCpuSemanticsSelectTopKSoftmax) {
  const std::string p = rewrite(saved_small_layer(), [](auto*, auto* meta) {
    meta->erase("qmoe.routing_method");
    meta->erase("qmoe.tie_break");
    (*meta)["qmoe.ort_semantics"] = "cpu";
  });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(l.spec.routing.method, RoutingMethod::kTopKSoftmax);
  EXPECT_EQ(l.spec.routing.ties, TieBreak::kHigherIndex);
}

TEST_F(LayerFileTest, Fp4LayoutKeyNeedsFp4) {
  const std::string p = rewrite(saved_small_layer(),
                                [](auto*, auto* meta) { (*meta)["qmoe.fp4_layout"] = "k_packed"; });
  LoadedLayer l;
  const Status s = load_layer_file(p, &l);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("qmoe.fp4_layout applies to quant_type fp4 or nvfp4"),
            std::string::npos)
      << s.message();
}

TEST_F(LayerFileTest, SaveRejectsWhatOrtCannotExpress) {
  LayerSpec s = test::small_spec(WeightFormat::kInt4);
  s.fc2.block_size = 64;
  test::TestLayer tl;
  test::make_layer(s, test::fresh_seed(), &tl);
  const Status st = save_layer_file(path("mixed.safetensors"), tl.spec, tl.weights);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("fc2 block size 64 differs from fc1's 128"), std::string::npos)
      << st.message();
}

TEST_F(LayerFileTest, InputAndOutputFilesRoundTrip) {
  test::make_layer(test::small_spec(WeightFormat::kInt4), test::fresh_seed(), &layer_);
  layer_.spec.act_dtype = DType::kBF16;
  test::TestInputs ti;
  test::make_inputs(layer_.spec, 5, test::fresh_seed(), true, &ti);
  const std::string p = path("in.safetensors");
  ASSERT_TRUE(save_input_file(p, ti.in).is_ok());
  LoadedInputs li;
  const Status s = load_input_file(p, &li);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  expect_same_tensor(ti.in.input, li.inputs.input, "input");
  expect_same_tensor(ti.in.router_logits, li.inputs.router_logits, "router_probs");
  expect_same_tensor(ti.in.router_weights, li.inputs.router_weights, "router_weights");

  const std::string o = path("out.safetensors");
  ASSERT_TRUE(save_output_file(o, ti.in.input).is_ok());
  std::unique_ptr<SafetensorsFile> f;
  ASSERT_TRUE(SafetensorsFile::open(o, &f).is_ok());
  ASSERT_NE(f->find("output"), nullptr);
  expect_same_tensor(ti.in.input, *f->find("output"), "output");
}

TEST_F(LayerFileTest, InputFileNeedsRouterProbs) {
  const float x[4] = {};
  const std::string p = path("in.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"input", TensorView(x, DType::kF32, {1, 4})}}).is_ok());
  LoadedInputs li;
  const Status s = load_input_file(p, &li);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("missing tensor 'router_probs'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace qmoe

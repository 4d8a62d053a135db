// Checkpoint import: the parsing pieces that need no files (config.json, the shard index), the
// layer spec each architecture maps onto (shared experts included), and the new safetensors
// dtypes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "convert/checkpoint.h"
#include "qmoe/convert.h"
#include "test_util.h"

namespace qmoe {
namespace {

void expect_error(const Status& s, StatusCode code, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(s.is_ok()) << "expected an error";
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const char* part : parts)
    EXPECT_NE(s.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << s.message();
}

const char* kQwen =
    R"({"model_type": "qwen3_moe", "hidden_size": 2048, "moe_intermediate_size": 768,
  "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true, "num_hidden_layers": 6,
  "decoder_sparse_step": 2, "mlp_only_layers": [3], "hidden_act": "silu"})";

TEST(ConvertConfig, Qwen3MoeLayersAndRouting) {
  MoeModelConfig c;
  ASSERT_TRUE(parse_model_config(kQwen, "config.json", &c).is_ok());
  EXPECT_EQ(c.arch, MoeArch::kQwen3Moe);
  EXPECT_EQ(c.hidden, 2048);
  EXPECT_EQ(c.inter, 768);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.top_k, 8);
  // (i + 1) % 2 == 0 and not in mlp_only_layers: 1, 5 (3 is dense).
  EXPECT_EQ(c.moe_layers, (std::vector<int>{1, 5}));
  const LayerSpec s = moe_layer_spec(c, default_fc_format(WeightFormat::kInt4),
                                     default_fc_format(WeightFormat::kInt8));
  EXPECT_EQ(s.routing.method, RoutingMethod::kSoftmaxTopK);
  EXPECT_TRUE(s.routing.normalize);
  EXPECT_EQ(s.activation.kind, Activation::kSwiGlu);
  EXPECT_EQ(s.activation.glu, GluLayout::kInterleaved);
  EXPECT_EQ(s.fc2.format, WeightFormat::kInt8);
  EXPECT_TRUE(check_spec(s).is_ok());
  EXPECT_FALSE(c.gptq.present);
}

TEST(ConvertConfig, MixtralEveryLayerTopKSoftmax) {
  MoeModelConfig c;
  ASSERT_TRUE(parse_model_config(R"({"model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
    "num_hidden_layers": 3})",
                                 "c", &c)
                  .is_ok());
  EXPECT_EQ(c.moe_layers, (std::vector<int>{0, 1, 2}));
  const LayerSpec s = moe_layer_spec(c, default_fc_format(WeightFormat::kInt4),
                                     default_fc_format(WeightFormat::kInt4));
  EXPECT_EQ(s.routing.method, RoutingMethod::kTopKSoftmax);
  EXPECT_EQ(s.inter, 14336);
}

TEST(ConvertConfig, DeepseekV3GroupedTopKAndFp8) {
  MoeModelConfig c;
  ASSERT_TRUE(parse_model_config(R"({"model_type": "deepseek_v3", "hidden_size": 7168,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_shared_experts": 1,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_hidden_layers": 6, "hidden_act": "silu",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
    "weight_block_size": [128, 128]}})",
                                 "c", &c)
                  .is_ok());
  EXPECT_EQ(c.arch, MoeArch::kDeepseekV3);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(c.n_shared, 1);
  EXPECT_TRUE(c.fp8.present);
  EXPECT_EQ(c.fp8.block, 128);
  const LayerSpec s = moe_layer_spec(c, default_fc_format(WeightFormat::kFp8Block),
                                     default_fc_format(WeightFormat::kFp8Block));
  EXPECT_EQ(s.routing.method, RoutingMethod::kGroupedTopK);
  EXPECT_EQ(s.routing.n_group, 8);
  EXPECT_EQ(s.routing.topk_group, 4);
  EXPECT_FLOAT_EQ(s.routing.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(s.routing.normalize);
  // The shared expert (n_shared_experts * I rows) is the last expert, added with weight 1.
  EXPECT_EQ(c.shared_inter, 2048);
  EXPECT_EQ(s.num_experts, 257);
  EXPECT_EQ(s.routing.num_shared, 1);
  EXPECT_EQ(s.routing.shared_weight, SharedWeight::kOne);
  EXPECT_TRUE(check_spec(s).is_ok());
  expect_error(parse_model_config(R"({"model_type": "deepseek_v3", "hidden_size": 64,
    "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1,
    "topk_group": 1, "n_shared_experts": 9, "num_hidden_layers": 1})",
                                  "c", &c),
               StatusCode::kInvalidArgument, {"n_shared_experts (0 .. n_routed_experts)"});
}

TEST(ConvertConfig, Fp8ScaleFmt) {
  std::string q = kQwen;
  q.pop_back();
  const std::string fp8 = R"(, "quantization_config": {"quant_method": "fp8",
    "activation_scheme": "dynamic", "weight_block_size": [128, 128], "scale_fmt": )";
  for (const char* ok : {"\"ue8m0\"", "\"float\"", "null"}) {
    MoeModelConfig c;
    EXPECT_TRUE(parse_model_config(q + fp8 + ok + "}}", "c", &c).is_ok()) << ok;
    EXPECT_TRUE(c.fp8.present);
  }
  MoeModelConfig c;
  expect_error(parse_model_config(q + fp8 + R"("ue4m3"}})", "c", &c), StatusCode::kUnsupported,
               {"quantization_config.scale_fmt", "ue4m3", "float or ue8m0"});
}

TEST(ConvertConfig, GptOssMxfp4) {
  MoeModelConfig c;
  ASSERT_TRUE(parse_model_config(R"({"model_type": "gpt_oss", "hidden_size": 2880,
    "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
    "num_hidden_layers": 2, "swiglu_limit": 7.0, "quantization_config": {"quant_method": "mxfp4"}})",
                                 "c", &c)
                  .is_ok());
  EXPECT_EQ(c.arch, MoeArch::kGptOss);
  EXPECT_TRUE(c.mxfp4);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{0, 1}));
  const LayerSpec s = moe_layer_spec(c, default_fc_format(WeightFormat::kMxFp4),
                                     default_fc_format(WeightFormat::kMxFp4));
  EXPECT_EQ(s.routing.method, RoutingMethod::kTopKSoftmax);
  EXPECT_FLOAT_EQ(s.activation.alpha, 1.702f);
  EXPECT_FLOAT_EQ(s.activation.beta, 1.0f);
  EXPECT_FLOAT_EQ(s.activation.limit, 7.0f);
  EXPECT_EQ(s.activation.glu, GluLayout::kInterleaved);
  EXPECT_TRUE(s.has_fc1_bias && s.has_fc2_bias);
  EXPECT_TRUE(check_spec(s).is_ok());
}

TEST(ConvertConfig, ModelOptNvfp4) {
  MoeModelConfig c;
  std::string q = kQwen;
  q.pop_back();
  ASSERT_TRUE(parse_model_config(q + R"(, "quantization_config": {"quant_method": "modelopt",
    "quant_algo": "NVFP4", "group_size": 16}})",
                                 "c", &c)
                  .is_ok());
  EXPECT_TRUE(c.nvfp4);
  EXPECT_EQ(c.quant_method, "modelopt");
  expect_error(parse_model_config(q + R"(, "quantization_config": {"quant_method": "modelopt",
    "quant_algo": "NVFP4", "group_size": 32}})",
                                  "c", &c),
               StatusCode::kUnsupported, {"group_size: 32"});
  SourceFormat f;
  ASSERT_TRUE(parse_source_format("nvfp4", &f));
  EXPECT_EQ(f, SourceFormat::kNvfp4);
}

TEST(ConvertConfig, PhiMoeSparseMixer) {
  MoeModelConfig c;
  const std::string phi = R"({"model_type": "phimoe", "hidden_size": 4096,
    "intermediate_size": 6400, "num_local_experts": 16, "num_hidden_layers": 2,
    "router_jitter_noise": 0.01, "num_experts_per_tok": )";
  ASSERT_TRUE(parse_model_config(phi + "2}", "c", &c).is_ok());
  EXPECT_EQ(c.arch, MoeArch::kPhiMoe);
  const LayerSpec s = moe_layer_spec(c, default_fc_format(WeightFormat::kInt4),
                                     default_fc_format(WeightFormat::kInt4));
  EXPECT_EQ(s.routing.method, RoutingMethod::kSparseMixer);
  EXPECT_FLOAT_EQ(s.routing.sparse_mixer_eps, 0.01f);
  EXPECT_TRUE(check_spec(s).is_ok());
  expect_error(parse_model_config(phi + "4}", "c", &c), StatusCode::kUnsupported,
               {"sparse mixer routes exactly 2"});
}

TEST(ConvertConfig, Gptq) {
  MoeModelConfig c;
  std::string q = kQwen;
  q.pop_back();
  q += R"(, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1,
    "sym": false, "desc_act": false, "checkpoint_format": "gptq_v2"}})";
  ASSERT_TRUE(parse_model_config(q, "c", &c).is_ok());
  EXPECT_TRUE(c.gptq.present);
  EXPECT_EQ(c.gptq.group_size, 0);
  EXPECT_FALSE(c.gptq.sym);
  EXPECT_TRUE(c.gptq.v2);
}

TEST(ConvertConfig, Awq) {
  MoeModelConfig c;
  std::string q = kQwen;
  q.pop_back();
  ASSERT_TRUE(parse_model_config(q + R"(, "quantization_config": {"quant_method": "awq",
    "bits": 4, "group_size": -1, "zero_point": true, "version": "GEMM"}})",
                                 "c", &c)
                  .is_ok());
  EXPECT_TRUE(c.awq.present);
  EXPECT_EQ(c.awq.group_size, 0);
  EXPECT_EQ(c.quant_method, "awq");
  expect_error(parse_model_config(q + R"(, "quantization_config": {"quant_method": "awq",
    "bits": 4, "group_size": 128, "version": "gemv"}})",
                                  "c", &c),
               StatusCode::kUnsupported, {"quantization_config.version", "gemv"});
}

TEST(ConvertConfig, CompressedTensorsPackQuantized) {
  MoeModelConfig c;
  std::string q = kQwen;
  q.pop_back();
  const std::string ct = R"(, "quantization_config": {"quant_method": "compressed-tensors",
    "format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"],
    "input_activations": null, "weights": {"num_bits": 8, "type": "int", "symmetric": false,
    "strategy": "group", "group_size": 64, "actorder": null}}}}})";
  ASSERT_TRUE(parse_model_config(q + ct, "c", &c).is_ok());
  EXPECT_TRUE(c.ct.present);
  EXPECT_EQ(c.ct.bits, 8);
  EXPECT_EQ(c.ct.group_size, 64);
  EXPECT_FALSE(c.ct.sym);
  std::string bad = ct;
  const std::string g64 = "\"group_size\": 64";
  bad.replace(bad.find(g64), g64.size(), "\"group_size\": 96");
  expect_error(parse_model_config(q + bad, "cfg.json", &c), StatusCode::kUnsupported,
               {"cfg.json", "group_size: 96"});
  bad = ct;
  bad.replace(bad.find("pack-quantized"), 14, "nvfp4-pack-quantized");
  expect_error(parse_model_config(q + bad, "c", &c), StatusCode::kUnsupported,
               {"format 'nvfp4-pack-quantized'"});
  // float-quantized FP8: "block" keeps its square blocks, "tensor" one scale per projection.
  bad = ct;
  bad.replace(bad.find("pack-quantized"), 14, "float-quantized");
  bad.replace(bad.find("\"int\""), 5, "\"float\"");
  bad.replace(bad.find("\"group\""), 7, "\"tensor\"");
  bad.replace(bad.find("false"), 5, "true");
  ASSERT_TRUE(parse_model_config(q + bad, "c", &c).is_ok());
  EXPECT_TRUE(c.ct.fp8 && c.ct.fp8_tensor);
  expect_error(parse_model_config(q + R"(, "quantization_config": {"quant_method":
    "compressed-tensors", "format": "pack-quantized"}})",
                                  "c", &c),
               StatusCode::kInvalidArgument, {"config_groups"});
}

TEST(ConvertConfig, ErrorsNameTheField) {
  MoeModelConfig c;
  expect_error(parse_model_config("{", "cfg.json", &c), StatusCode::kInvalidArgument,
               {"cfg.json", "not valid JSON"});
  expect_error(parse_model_config(R"({"model_type": "llama"})", "cfg.json", &c),
               StatusCode::kUnsupported, {"model_type 'llama'"});
  std::string q = kQwen;
  q.pop_back();
  expect_error(parse_model_config(q + R"(, "num_experts_per_tok": 200})", "c", &c),
               StatusCode::kInvalidArgument, {"num_experts_per_tok 200"});
  expect_error(parse_model_config(q + R"(, "hidden_size": "2048"})", "c", &c),
               StatusCode::kInvalidArgument, {"'hidden_size'", "integer"});
  expect_error(parse_model_config(q + R"(, "hidden_act": "gelu"})", "c", &c),
               StatusCode::kUnsupported, {"hidden_act 'gelu'"});
  expect_error(
      parse_model_config(q + R"(, "quantization_config": {"quant_method": "gptq", "bits": 3,
        "group_size": 128}})",
                         "c", &c),
      StatusCode::kUnsupported, {"quantization_config.bits", "3"});
  expect_error(
      parse_model_config(q + R"(, "quantization_config": {"quant_method": "gptq", "bits": 4,
        "group_size": 48}})",
                         "c", &c),
      StatusCode::kUnsupported, {"group_size", "48"});
  expect_error(
      parse_model_config(q + R"(, "quantization_config": {"quant_method": "hqq"}})", "c", &c),
      StatusCode::kUnsupported, {"quant_method 'hqq'"});
}

LayerSpec int4_spec(const MoeModelConfig& c) {
  return moe_layer_spec(c, default_fc_format(WeightFormat::kInt4),
                        default_fc_format(WeightFormat::kInt4));
}

// Qwen1.5-MoE-A2.7B's sizes: the shared expert is 4 routed experts wide.
const char* kQwen2 =
    R"({"model_type": "qwen2_moe", "hidden_size": 2048, "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632, "intermediate_size": 5632, "num_experts": 60,
  "num_experts_per_tok": 4, "norm_topk_prob": false, "num_hidden_layers": 4,
  "decoder_sparse_step": 1, "mlp_only_layers": [0], "hidden_act": "silu"})";

TEST(ConvertConfig, Qwen2MoeSharedExpertSplit) {
  MoeModelConfig c;
  ASSERT_TRUE(parse_model_config(kQwen2, "config.json", &c).is_ok());
  EXPECT_EQ(c.arch, MoeArch::kQwen2Moe);
  EXPECT_EQ(c.inter, 1408);
  EXPECT_EQ(c.num_experts, 60);
  EXPECT_EQ(c.shared_inter, 5632);
  EXPECT_EQ(c.num_shared(), 4);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{1, 2, 3}));
  const LayerSpec s = int4_spec(c);
  EXPECT_EQ(s.num_experts, 64);  // 60 routed, then 4 shared slices
  EXPECT_EQ(s.routing.num_shared, 4);
  EXPECT_EQ(s.routing.method, RoutingMethod::kSoftmaxTopK);
  EXPECT_FALSE(s.routing.normalize);
  EXPECT_EQ(s.routing.combine, CombineMode::kScaleOutput);
  EXPECT_EQ(s.routing.shared_weight, SharedWeight::kSigmoid);  // sigmoid(shared_expert_gate)
  EXPECT_TRUE(check_spec(s).is_ok());

  std::string bad = kQwen2;
  bad.replace(bad.find("5632"), 4, "5000");
  expect_error(
      parse_model_config(bad, "config.json", &c), StatusCode::kUnsupported,
      {"config.json", "shared_expert_intermediate_size 5000", "moe_intermediate_size 1408"});
  bad = kQwen2;
  bad.replace(bad.find("\"shared_expert_intermediate_size\""), 33, "\"unused_size\"");
  expect_error(parse_model_config(bad, "config.json", &c), StatusCode::kInvalidArgument,
               {"missing 'shared_expert_intermediate_size'"});
}

// Llama-4 Maverick's text config: every other layer is an MoE layer.
const std::string kLlama4Text =
    R"({"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
  "intermediate_size_mlp": 16384, "num_local_experts": 128, "num_experts_per_tok": 1,
  "num_hidden_layers": 6, "interleave_moe_layer_step": 2, "hidden_act": "silu")";

TEST(ConvertConfig, Llama4TextSigmoidScaleInput) {
  MoeModelConfig c;
  ASSERT_TRUE(parse_model_config(kLlama4Text + "}", "config.json", &c).is_ok());
  EXPECT_EQ(c.arch, MoeArch::kLlama4);
  EXPECT_EQ(c.inter, 8192);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.top_k, 1);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{1, 3, 5}));  // from step - 1, every step-th
  const LayerSpec s = int4_spec(c);
  EXPECT_EQ(s.routing.method, RoutingMethod::kTopKSigmoid);
  EXPECT_EQ(s.routing.combine, CombineMode::kScaleInput);
  EXPECT_FALSE(s.routing.normalize);
  EXPECT_EQ(s.num_experts, 129);  // the shared expert (I rows), weight 1, last
  EXPECT_EQ(s.routing.num_shared, 1);
  EXPECT_EQ(s.routing.shared_weight, SharedWeight::kOne);
  EXPECT_TRUE(check_spec(s).is_ok());
  // moe_layers, where given, overrides the step (Llama4TextConfig's rule).
  ASSERT_TRUE(parse_model_config(kLlama4Text + R"(, "moe_layers": [4, 0]})", "c", &c).is_ok());
  EXPECT_EQ(c.moe_layers, (std::vector<int>{0, 4}));
  expect_error(parse_model_config(kLlama4Text + R"(, "moe_layers": [9]})", "c", &c),
               StatusCode::kInvalidArgument, {"'moe_layers'", "below 6"});
  expect_error(parse_model_config(kLlama4Text + R"(, "moe_layers": 1})", "c", &c),
               StatusCode::kInvalidArgument, {"'moe_layers'"});
}

TEST(ConvertConfig, Llama4MultimodalReadsTextConfig) {
  MoeModelConfig c;
  const std::string mm = R"({"model_type": "llama4", "vision_config": {"hidden_size": 1408},
    "text_config": )" + kLlama4Text +
                         R"(, "moe_layers": null}})";
  ASSERT_TRUE(parse_model_config(mm, "config.json", &c).is_ok());
  EXPECT_EQ(c.arch, MoeArch::kLlama4);
  EXPECT_EQ(c.model_type, "llama4");
  EXPECT_EQ(c.hidden, 5120);
  EXPECT_EQ(c.moe_layers, (std::vector<int>{1, 3, 5}));
  expect_error(
      parse_model_config(R"({"model_type": "llama4", "hidden_size": 5120})", "cfg.json", &c),
      StatusCode::kInvalidArgument, {"cfg.json", "missing 'text_config'"});
  const std::string bad =
      R"({"model_type": "llama4", "text_config": )" + kLlama4Text + R"(, "hidden_act": "gelu"}})";
  expect_error(parse_model_config(bad, "cfg.json", &c), StatusCode::kUnsupported,
               {"cfg.json: text_config", "hidden_act 'gelu'"});
}

TEST(ConvertIndex, ParsesAndRejectsPathsOutsideTheDirectory) {
  std::map<std::string, std::string> m;
  ASSERT_TRUE(convert::parse_index(R"({"metadata": {}, "weight_map": {"a": "s1.safetensors",
    "b": "s2.safetensors"}})",
                                   "idx", &m)
                  .is_ok());
  EXPECT_EQ(m.at("b"), "s2.safetensors");
  expect_error(convert::parse_index(R"({"weight_map": {"a": "../x.safetensors"}})", "idx", &m),
               StatusCode::kInvalidArgument, {"weight_map['a']", "not a file name"});
  expect_error(convert::parse_index(R"({"weight_map": {"a": 3}})", "idx", &m),
               StatusCode::kInvalidArgument, {"weight_map['a']"});
  expect_error(convert::parse_index(R"({"metadata": {}})", "idx", &m), StatusCode::kInvalidArgument,
               {"missing 'weight_map'"});
}

TEST(ConvertDtypes, CheckpointMetadataDtypesParse) {
  for (const char* name : {"I64", "I16", "U16", "U32", "U64", "BOOL", "F8_E5M2"}) {
    DType t;
    ASSERT_TRUE(parse_safetensors_dtype(name, &t)) << name;
    EXPECT_STREQ(safetensors_dtype_name(t), name);
    EXPECT_GT(dtype_size(t), 0u) << name;
  }
  DType t;
  EXPECT_FALSE(parse_safetensors_dtype("C64", &t));
}

TEST(ConvertSource, Names) {
  SourceFormat f;
  ASSERT_TRUE(parse_source_format("gptq", &f));
  EXPECT_EQ(f, SourceFormat::kGptq);
  ASSERT_TRUE(parse_source_format("awq", &f));
  EXPECT_EQ(f, SourceFormat::kAwq);
  ASSERT_TRUE(parse_source_format("compressed-tensors", &f));
  EXPECT_STREQ(source_format_name(f), "compressed-tensors");
  EXPECT_FALSE(parse_source_format("hqq", &f));
}

class ConvertFiles : public test::TempDirTest {};

// Dropping the pages under a view (the converter does it after each expert) leaves the view
// readable: the pages come back from the file.
TEST_F(ConvertFiles, ReleasedViewsReadBackFromTheFile) {
  std::vector<uint16_t> a(3 * 4096 + 5), b(100);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(i + 7);
  const std::string p = path("r.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"a", TensorView(a.data(), DType::kBF16, {int64_t(a.size())})},
                                    {"b", TensorView(b.data(), DType::kU16, {100})}})
                  .is_ok());
  std::unique_ptr<SafetensorsFile> f;
  ASSERT_TRUE(SafetensorsFile::open(p, &f).is_ok());
  TensorView va, vb;
  ASSERT_TRUE(f->get("a", &va).is_ok());
  ASSERT_TRUE(f->get("b", &vb).is_ok());
  EXPECT_EQ(std::memcmp(va.data, a.data(), a.size() * 2), 0);
  f->release(va);
  f->release(TensorView(b.data(), DType::kU16, {100}));  // not in the mapping: ignored
  EXPECT_EQ(std::memcmp(va.data, a.data(), a.size() * 2), 0);
  EXPECT_EQ(std::memcmp(vb.data, b.data(), b.size() * 2), 0);
  EXPECT_EQ(b[99], 106);
}

}  // namespace
}  // namespace qmoe

#include "presets.h"

#include "qmoe/format.h"

namespace qmoe::cli {

namespace {

// One row of the table; routing and activation details are filled in by the builders below.
struct Shape {
  int64_t hidden, inter, experts;
  int top_k;
  WeightFormat format;
};

LayerSpec base(const Shape& s, RoutingMethod method, bool normalize) {
  LayerSpec spec;
  spec.hidden = s.hidden;
  spec.inter = s.inter;
  spec.num_experts = s.experts;
  spec.routing.top_k = s.top_k;
  spec.routing.method = method;
  spec.routing.normalize = normalize;
  spec.activation.kind = Activation::kSwiGlu;
  spec.activation.glu = GluLayout::kInterleaved;
  spec.fc1 = spec.fc2 = spec.fc3 = default_fc_format(s.format);
  return spec;
}

std::vector<Preset> build() {
  std::vector<Preset> p;
  p.push_back({"qwen3-30b-a3b", "Qwen3-30B-A3B", "",
               base({2048, 768, 128, 8, WeightFormat::kInt4}, RoutingMethod::kSoftmaxTopK, true)});
  p.push_back({"qwen3.6-35b-a3b", "Qwen3.6-35B-A3B", "routed experts only",
               base({2048, 512, 256, 8, WeightFormat::kInt4}, RoutingMethod::kSoftmaxTopK, true)});
  p.push_back({"mixtral-8x7b", "Mixtral-8x7B", "",
               base({4096, 14336, 8, 2, WeightFormat::kInt4}, RoutingMethod::kTopKSoftmax, false)});
  {
    // Gate and up projections are separate tensors in the checkpoint (FC1 and FC3), as ORT's
    // block-FP8 path takes them.
    LayerSpec s =
        base({7168, 2048, 256, 8, WeightFormat::kFp8Block}, RoutingMethod::kGroupedTopK, true);
    s.activation.glu = GluLayout::kSeparateFc3;
    s.routing.n_group = 8;
    s.routing.topk_group = 4;
    s.routing.routed_scaling_factor = 2.5f;
    p.push_back({"deepseek-v3", "DeepSeek-V3",
                 "routed experts only (the shared expert is a dense MLP)", s});
  }
  {
    // 2880 is not a multiple of 128: the integer default block does not fit, MXFP4's 32 does.
    LayerSpec s =
        base({2880, 2880, 32, 4, WeightFormat::kMxFp4}, RoutingMethod::kTopKSoftmax, false);
    s.activation.alpha = 1.702f;
    s.activation.beta = 1.0f;
    s.activation.limit = 7.0f;
    s.has_fc1_bias = s.has_fc2_bias = true;
    p.push_back({"gpt-oss-20b", "gpt-oss-20b", "", s});
  }
  p.push_back({"phi-3.5-moe", "Phi-3.5-MoE", "",
               base({4096, 6400, 16, 2, WeightFormat::kInt4}, RoutingMethod::kSparseMixer, false)});
  {
    // 16 routed experts plus the shared one (the last), which is always on with weight 1.
    LayerSpec s =
        base({5120, 8192, 17, 1, WeightFormat::kInt4}, RoutingMethod::kTopKSigmoid, false);
    s.routing.num_shared = 1;
    s.routing.shared_weight = SharedWeight::kOne;
    s.routing.combine = CombineMode::kScaleInput;
    p.push_back({"llama-4-scout", "Llama-4-Scout-17B-16E", "", s});
  }
  return p;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = build();
  return table;
}

const Preset* find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return &p;
  return nullptr;
}

std::string preset_names() {
  std::string s;
  for (const Preset& p : presets()) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

}  // namespace qmoe::cli

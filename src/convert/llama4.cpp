// Llama-4's MoE blocks (transformers modeling_llama4.py, Llama4TextMoe), read from float
// checkpoints. All routed experts of a layer live in two tensors that store y = x W:
//
//   feed_forward.router.weight          [E, H]       logits = x W^T
//   feed_forward.experts.gate_up_proj   [E, H, 2I]   columns [0, I): gate, [I, 2I): up
//   feed_forward.experts.down_proj      [E, I, H]
//   feed_forward.shared_expert.{gate,up,down}_proj.weight  [I, H], [I, H], [H, I]
//
// under model.layers.N. (Llama4ForCausalLM, model_type llama4_text) or
// language_model.model.layers.N. (Llama4ForConditionalGeneration, model_type llama4). The block
// routes each token to the top-k logits, scales the expert's INPUT by sigmoid(logit) and adds
// the shared expert with weight 1. Each expert's gate, up and down are read in place
// (ProjTensors::at, float_experts.cpp) and quantized like any float expert.
#include "convert/experts.h"

namespace qmoe::convert {

Status resolve_llama4_layer(const Checkpoint& c, SourceFormat from, int index, LayerSource* out) {
  const MoeModelConfig& cfg = c.config();
  if (!is_float_source(from)) {
    return Status::unsupported(c.dir() + "/config.json: model_type '" + cfg.model_type +
                               "' is read from float checkpoints only (--from bf16, fp16, fp32), "
                               "not --from " +
                               source_format_name(from));
  }
  const int64_t E = cfg.num_experts, H = cfg.hidden, I = cfg.inter;
  // Where the model type says, else where the tensors are (errors name the expected place).
  const std::string text = "model.layers." + std::to_string(index) + ".feed_forward.";
  const std::string multimodal = "language_model." + text;
  std::string prefix = cfg.model_type == "llama4" ? multimodal : text;
  const std::string other = cfg.model_type == "llama4" ? text : multimodal;
  if (!c.has(prefix + "router.weight") && c.has(other + "router.weight")) prefix = other;
  LayerSource l;
  l.index = index;
  l.router_name = prefix + "router.weight";
  QMOE_RETURN_IF_ERROR(expect_float(c, l.router_name, {E, H}, &l.router));
  const std::string fc1 = prefix + "experts.gate_up_proj", fc2 = prefix + "experts.down_proj";
  TensorView w1, w2;
  QMOE_RETURN_IF_ERROR(c.expect(fc1, source_dtype(from), {E, H, 2 * I}, &w1));
  QMOE_RETURN_IF_ERROR(c.expect(fc2, source_dtype(from), {E, I, H}, &w2));
  l.source_bytes = static_cast<int64_t>(l.router.bytes() + w1.bytes() + w2.bytes());
  for (int64_t e = 0; e < E; ++e) {
    const std::string at = "[" + std::to_string(e) + "]";
    const std::string half = std::to_string(I);
    const TensorView gate_up = expert_slice(w1, e, {H, 2 * I});
    ExpertTensors t;
    t.gate = proj_of(fc1 + at + "[:, :" + half + "]", I, H, gate_up, {0, 1, 2 * I});
    t.up = proj_of(fc1 + at + "[:, " + half + ":]", I, H, gate_up, {I, 1, 2 * I});
    t.down = proj_of(fc2 + at, H, I, expert_slice(w2, e, {I, H}), {0, 1, H});
    l.experts.push_back(t);
  }
  if (cfg.num_shared() > 0) {
    DType scale_dtype = DType::kU8;
    QMOE_RETURN_IF_ERROR(resolve_shared(c, from, prefix, &scale_dtype, &l));
  }
  *out = std::move(l);
  return Status::ok();
}

}  // namespace qmoe::convert

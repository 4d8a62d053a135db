// config.json of a Hugging Face MoE checkpoint: the fields that shape the MoE blocks, and
// quantization_config for GPTQ. Only what the conversion needs is read; everything else is ignored.
#include <nlohmann/json.hpp>
#include <set>

#include "qmoe/convert.h"

namespace qmoe {

namespace {

using Json = nlohmann::json;

class Reader {
 public:
  Reader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  Status integer(const char* key, int64_t* out, bool required = true) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) {
      return required ? Status::invalid(where_ + ": missing '" + key + "'") : Status::ok();
    }
    if (!it->is_number_integer()) {
      return Status::invalid(where_ + ": '" + key + "': expected an integer, got " + it->dump());
    }
    *out = it->get<int64_t>();
    return Status::ok();
  }
  Status positive(const char* key, int64_t* out) const {
    QMOE_RETURN_IF_ERROR(integer(key, out));
    if (*out <= 0 || *out > (int64_t{1} << 30)) {
      return Status::invalid(where_ + ": '" + key + "': expected a positive integer, got " +
                             std::to_string(*out));
    }
    return Status::ok();
  }
  Status boolean(const char* key, bool* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Status::ok();
    if (!it->is_boolean()) {
      return Status::invalid(where_ + ": '" + key + "': expected true or false, got " + it->dump());
    }
    *out = it->get<bool>();
    return Status::ok();
  }
  Status string(const char* key, std::string* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Status::ok();
    if (!it->is_string()) {
      return Status::invalid(where_ + ": '" + key + "': expected a string, got " + it->dump());
    }
    *out = it->get<std::string>();
    return Status::ok();
  }

 private:
  const Json& j_;
  std::string where_;
};

Status parse_gptq(const Json& q, const std::string& where, GptqConfig* g) {
  const Reader r(q, where + ": quantization_config");
  int64_t bits = 4, group = -1;
  QMOE_RETURN_IF_ERROR(r.integer("bits", &bits));
  if (bits != 4 && bits != 8) {
    return Status::unsupported(where + ": quantization_config.bits: GPTQ with " +
                               std::to_string(bits) + " bits is not supported (4 or 8)");
  }
  QMOE_RETURN_IF_ERROR(r.integer("group_size", &group));
  if (group != -1 && group != 32 && group != 64 && group != 128) {
    return Status::unsupported(where +
                               ": quantization_config.group_size: " + std::to_string(group) +
                               " is not supported (32, 64, 128, or -1 for per channel)");
  }
  QMOE_RETURN_IF_ERROR(r.boolean("sym", &g->sym));
  QMOE_RETURN_IF_ERROR(r.boolean("desc_act", &g->desc_act));
  std::string format = "gptq";
  QMOE_RETURN_IF_ERROR(r.string("checkpoint_format", &format));
  if (format != "gptq" && format != "gptq_v2") {
    return Status::unsupported(where + ": quantization_config.checkpoint_format: '" + format +
                               "' is not supported (gptq or gptq_v2)");
  }
  g->present = true;
  g->bits = static_cast<int>(bits);
  g->group_size = group < 0 ? 0 : static_cast<int>(group);
  g->v2 = format == "gptq_v2";
  return Status::ok();
}

// Qwen3-MoE: layer i has a sparse block unless listed in mlp_only_layers, and when
// (i + 1) % decoder_sparse_step == 0 (modeling_qwen3_moe.py's rule).
Status qwen3_layers(const Json& j, const Reader& r, const std::string& where, MoeModelConfig* c) {
  int64_t step = 1;
  QMOE_RETURN_IF_ERROR(r.integer("decoder_sparse_step", &step, false));
  if (step <= 0) {
    return Status::invalid(where + ": 'decoder_sparse_step': expected a positive integer, got " +
                           std::to_string(step));
  }
  std::set<int64_t> dense;
  auto it = j.find("mlp_only_layers");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array()) {
      return Status::invalid(where + ": 'mlp_only_layers': expected a list of layer indices");
    }
    for (const Json& v : *it) {
      if (!v.is_number_integer()) {
        return Status::invalid(where + ": 'mlp_only_layers': expected integers, got " + v.dump());
      }
      dense.insert(v.get<int64_t>());
    }
  }
  for (int64_t i = 0; i < c->num_layers; ++i) {
    if (!dense.count(i) && (i + 1) % step == 0) c->moe_layers.push_back(static_cast<int>(i));
  }
  return Status::ok();
}

}  // namespace

Status parse_model_config(const std::string& json_text, const std::string& where,
                          MoeModelConfig* out) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid(where + ": not valid JSON");
  if (!j.is_object()) return Status::invalid(where + ": expected a JSON object");
  MoeModelConfig c;
  const Reader r(j, where);
  QMOE_RETURN_IF_ERROR(r.string("model_type", &c.model_type));
  if (c.model_type == "qwen3_moe") {
    c.arch = MoeArch::kQwen3Moe;
  } else if (c.model_type == "mixtral") {
    c.arch = MoeArch::kMixtral;
  } else {
    return Status::unsupported(where + ": model_type '" + c.model_type +
                               "' is not supported (qwen3_moe, mixtral)");
  }
  const bool qwen = c.arch == MoeArch::kQwen3Moe;
  QMOE_RETURN_IF_ERROR(r.positive("hidden_size", &c.hidden));
  QMOE_RETURN_IF_ERROR(r.positive(qwen ? "moe_intermediate_size" : "intermediate_size", &c.inter));
  QMOE_RETURN_IF_ERROR(r.positive(qwen ? "num_experts" : "num_local_experts", &c.num_experts));
  int64_t k = 0;
  QMOE_RETURN_IF_ERROR(r.positive("num_experts_per_tok", &k));
  if (k > c.num_experts) {
    return Status::invalid(where + ": num_experts_per_tok " + std::to_string(k) +
                           " exceeds the expert count " + std::to_string(c.num_experts));
  }
  c.top_k = static_cast<int>(k);
  QMOE_RETURN_IF_ERROR(r.positive("num_hidden_layers", &c.num_layers));
  std::string act = "silu";
  QMOE_RETURN_IF_ERROR(r.string("hidden_act", &act));
  if (act != "silu") {
    return Status::unsupported(where + ": hidden_act '" + act + "' is not supported (silu)");
  }
  if (qwen) {
    c.normalize = false;  // Qwen3MoeConfig's default
    QMOE_RETURN_IF_ERROR(r.boolean("norm_topk_prob", &c.normalize));
    QMOE_RETURN_IF_ERROR(qwen3_layers(j, r, where, &c));
  } else {
    for (int64_t i = 0; i < c.num_layers; ++i) c.moe_layers.push_back(static_cast<int>(i));
  }
  auto q = j.find("quantization_config");
  if (q != j.end() && !q->is_null()) {
    if (!q->is_object()) return Status::invalid(where + ": 'quantization_config': not an object");
    std::string method;
    QMOE_RETURN_IF_ERROR(
        Reader(*q, where + ": quantization_config").string("quant_method", &method));
    if (method != "gptq") {
      return Status::unsupported(where + ": quantization_config.quant_method '" + method +
                                 "' is not supported (gptq)");
    }
    QMOE_RETURN_IF_ERROR(parse_gptq(*q, where, &c.gptq));
  }
  *out = std::move(c);
  return Status::ok();
}

LayerSpec moe_layer_spec(const MoeModelConfig& c, const FcFormat& fc1, const FcFormat& fc2) {
  LayerSpec s;
  s.hidden = c.hidden;
  s.inter = c.inter;
  s.num_experts = c.num_experts;
  s.activation.kind = Activation::kSwiGlu;  // silu(gate) * up: alpha 1, beta 0, no limit
  s.activation.glu = GluLayout::kInterleaved;
  s.routing.top_k = c.top_k;
  if (c.arch == MoeArch::kQwen3Moe) {
    // softmax over all experts in fp32, top-k, renormalized when norm_topk_prob.
    s.routing.method = RoutingMethod::kSoftmaxTopK;
    s.routing.normalize = c.normalize;
  } else {
    // Mixtral: softmax, top-k, renormalize == softmax over the top-k logits.
    s.routing.method = RoutingMethod::kTopKSoftmax;
    s.routing.normalize = false;
  }
  s.fc1 = s.fc3 = fc1;
  s.fc2 = fc2;
  return s;
}

bool parse_source_format(const std::string& name, SourceFormat* out) {
  for (SourceFormat f :
       {SourceFormat::kBf16, SourceFormat::kFp16, SourceFormat::kFp32, SourceFormat::kGptq}) {
    if (name == source_format_name(f)) {
      *out = f;
      return true;
    }
  }
  return false;
}

const char* source_format_name(SourceFormat f) {
  switch (f) {
    case SourceFormat::kBf16:
      return "bf16";
    case SourceFormat::kFp16:
      return "fp16";
    case SourceFormat::kFp32:
      return "fp32";
    case SourceFormat::kGptq:
      return "gptq";
  }
  return "?";
}

}  // namespace qmoe

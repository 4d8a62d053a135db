// config.json of a Hugging Face MoE checkpoint: the fields that shape the MoE blocks, and
// quantization_config for GPTQ, AWQ and compressed-tensors. Only what the conversion needs is
// read; everything else is ignored.
#include <algorithm>
#include <cctype>
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
  Status number(const char* key, double* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Status::ok();
    if (!it->is_number()) {
      return Status::invalid(where_ + ": '" + key + "': expected a number, got " + it->dump());
    }
    *out = it->get<double>();
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

// Group sizes qmoe's integer blocks hold: a power of two in [16, 256] (K is checked per tensor).
bool block_group(int64_t g) { return g >= 16 && g <= 256 && (g & (g - 1)) == 0; }

// AutoAWQ's quantization_config: {"quant_method": "awq", "bits": 4, "group_size": 128,
// "zero_point": true, "version": "gemm"}.
Status parse_awq(const Json& q, const std::string& where, AwqConfig* a) {
  const Reader r(q, where + ": quantization_config");
  int64_t bits = 4, group = 128;
  QMOE_RETURN_IF_ERROR(r.integer("bits", &bits));
  if (bits != 4) {
    return Status::unsupported(where + ": quantization_config.bits: AWQ with " +
                               std::to_string(bits) + " bits is not supported (4)");
  }
  QMOE_RETURN_IF_ERROR(r.integer("group_size", &group));
  if (group != -1 && !block_group(group)) {
    return Status::unsupported(where +
                               ": quantization_config.group_size: " + std::to_string(group) +
                               " is not supported (a power of two in 16..256, or -1)");
  }
  bool zero_point = true;
  QMOE_RETURN_IF_ERROR(r.boolean("zero_point", &zero_point));
  if (!zero_point) {
    return Status::unsupported(where +
                               ": quantization_config.zero_point: false is not supported (AWQ's "
                               "GEMM packing stores zero points)");
  }
  std::string version = "gemm";
  QMOE_RETURN_IF_ERROR(r.string("version", &version));
  for (char& ch : version) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (version != "gemm") {
    return Status::unsupported(where + ": quantization_config.version: '" + version +
                               "' is not supported (gemm; GEMV and Marlin packings differ)");
  }
  a->present = true;
  a->bits = 4;
  a->group_size = group < 0 ? 0 : static_cast<int>(group);
  return Status::ok();
}

// compressed-tensors' quantization_config: "format" ("pack-quantized" or "float-quantized") and
// config_groups, each {"targets": [...], "weights": {"num_bits", "type", "symmetric",
// "strategy", "group_size", "block_structure", "actorder"}, "input_activations"}. Every group must
// carry the same weight scheme (the experts' projections are plain Linears).
Status parse_compressed_tensors(const Json& q, const std::string& where,
                                CompressedTensorsConfig* c) {
  const std::string qc = where + ": quantization_config";
  std::string format;
  QMOE_RETURN_IF_ERROR(Reader(q, qc).string("format", &format));
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->empty()) {
    return Status::invalid(qc + ": missing 'config_groups' (an object of quantization schemes)");
  }
  const Json* weights = nullptr;
  std::string first_format;
  for (auto it = groups->begin(); it != groups->end(); ++it) {
    const std::string g = qc + ".config_groups." + it.key();
    if (!it->is_object()) return Status::invalid(g + ": expected an object");
    std::string gformat = format;
    QMOE_RETURN_IF_ERROR(Reader(*it, g).string("format", &gformat));
    if (gformat != "pack-quantized" && gformat != "float-quantized") {
      return Status::unsupported(g + ": format '" + gformat +
                                 "' is not supported (pack-quantized, float-quantized)");
    }
    // Activations quantized per token at run time leave the weights as they are; static
    // activation scales would be lost.
    auto in = it->find("input_activations");
    if (in != it->end() && !in->is_null()) {
      bool dynamic = false;
      if (in->is_object()) {
        QMOE_RETURN_IF_ERROR(Reader(*in, g + ".input_activations").boolean("dynamic", &dynamic));
      }
      if (!dynamic) {
        return Status::unsupported(g +
                                   ".input_activations: static activation quantization is not "
                                   "supported (qmoe carries no activation scales)");
      }
    }
    auto w = it->find("weights");
    if (w == it->end() || !w->is_object()) {
      return Status::invalid(g + ": missing 'weights' (the weight quantization scheme)");
    }
    if (weights && (*weights != *w || gformat != first_format)) {
      return Status::unsupported(g +
                                 ".weights: differs from another group's scheme; one scheme "
                                 "for every layer is supported");
    }
    weights = &*w;
    first_format = gformat;
  }
  const std::string wq = qc + ".config_groups.*.weights";
  const Reader r(*weights, wq);
  const bool fp = first_format == "float-quantized";
  std::string type = fp ? "float" : "int", strategy, actorder;
  int64_t bits = 0, group = 0;
  QMOE_RETURN_IF_ERROR(r.string("type", &type));
  if (type != (fp ? "float" : "int")) {
    return Status::unsupported(wq + ".type: '" + type + "' is not supported with " + first_format +
                               " (" + (fp ? "float" : "int") + ")");
  }
  QMOE_RETURN_IF_ERROR(r.integer("num_bits", &bits));
  if (fp ? bits != 8 : (bits != 4 && bits != 8)) {
    return Status::unsupported(wq + ".num_bits: " + std::to_string(bits) + " is not supported (" +
                               (fp ? "8: FP8 e4m3" : "4 or 8") + ")");
  }
  QMOE_RETURN_IF_ERROR(r.string("strategy", &strategy));
  if (fp && strategy == "block") {
    auto b = weights->find("block_structure");
    if (b == weights->end() || !b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
        (*b)[0] != (*b)[1] || (*b)[0].get<int64_t>() < 1 || (*b)[0].get<int64_t>() > 4096) {
      return Status::unsupported(wq + ".block_structure: expected square blocks [b, b], got " +
                                 (b == weights->end() ? std::string("nothing") : b->dump()));
    }
    group = (*b)[0].get<int64_t>();
  } else if (!fp && strategy == "group") {
    QMOE_RETURN_IF_ERROR(r.integer("group_size", &group));
    if (!block_group(group)) {
      return Status::unsupported(wq + ".group_size: " + std::to_string(group) +
                                 " is not supported (a power of two in 16..256)");
    }
  } else if (strategy != "channel" && !(fp && strategy == "tensor")) {
    return Status::unsupported(wq + ".strategy: '" + strategy + "' is not supported (" +
                               (fp ? "tensor, channel or block" : "group or channel") + ")");
  }
  QMOE_RETURN_IF_ERROR(r.string("actorder", &actorder));
  if (actorder == "group") {
    return Status::unsupported(wq +
                               ".actorder: 'group' (activation-ordered groups, weight_g_idx) is "
                               "not supported");
  }
  QMOE_RETURN_IF_ERROR(r.boolean("symmetric", &c->sym));
  if (fp && !c->sym) {
    return Status::unsupported(wq + ".symmetric: false is not supported for FP8 weights");
  }
  c->present = true;
  c->bits = static_cast<int>(bits);
  c->group_size = static_cast<int>(group);
  c->fp8 = fp;
  c->fp8_tensor = fp && strategy == "tensor";
  return Status::ok();
}

// quant_method "fp8" (DeepSeek-V3, Qwen3 FP8): {"fmt": "e4m3", "activation_scheme": "dynamic",
// "weight_block_size": [128, 128]}.
Status parse_fp8(const Json& q, const std::string& where, Fp8Config* f) {
  const std::string qc = where + ": quantization_config";
  const Reader r(q, qc);
  std::string fmt = "e4m3", scheme = "dynamic", scale_fmt = "float";
  QMOE_RETURN_IF_ERROR(r.string("fmt", &fmt));
  if (fmt != "e4m3") {
    return Status::unsupported(qc + ".fmt: '" + fmt + "' is not supported (e4m3)");
  }
  // The stored dtype of weight_scale_inv (F32 or F8_E8M0) says how to read it; scale_fmt is
  // only checked to be one of transformers' two.
  QMOE_RETURN_IF_ERROR(r.string("scale_fmt", &scale_fmt));
  if (scale_fmt != "float" && scale_fmt != "ue8m0") {
    return Status::unsupported(qc + ".scale_fmt: '" + scale_fmt +
                               "' is not supported (float or ue8m0)");
  }
  QMOE_RETURN_IF_ERROR(r.string("activation_scheme", &scheme));
  if (scheme != "dynamic") {
    return Status::unsupported(qc + ".activation_scheme: '" + scheme +
                               "' is not supported (dynamic: no activation scales to carry)");
  }
  auto b = q.find("weight_block_size");
  if (b == q.end() || !b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
      (*b)[0] != (*b)[1] || (*b)[0].get<int64_t>() < 1 || (*b)[0].get<int64_t>() > 4096) {
    return Status::unsupported(
        qc +
        ".weight_block_size: expected square blocks [b, b] (per-tensor FP8 is not "
        "supported), got " +
        (b == q.end() ? std::string("nothing") : b->dump()));
  }
  f->present = true;
  f->block = (*b)[0].get<int>();
  return Status::ok();
}

// ModelOpt's export: {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}.
Status parse_modelopt(const Json& q, const std::string& where) {
  const std::string qc =
      where + (where.find("hf_quant_config") == std::string::npos ? ": quantization_config"
                                                                  : ": quantization");
  const Reader r(q, qc);
  std::string algo;
  int64_t group = 16;
  QMOE_RETURN_IF_ERROR(r.string("quant_algo", &algo));
  if (algo != "NVFP4") {
    return Status::unsupported(qc + ".quant_algo: '" + algo + "' is not supported (NVFP4)");
  }
  QMOE_RETURN_IF_ERROR(r.integer("group_size", &group, false));
  if (group != 16) {
    return Status::unsupported(qc + ".group_size: " + std::to_string(group) +
                               " is not supported (NVFP4 blocks are 16)");
  }
  return Status::ok();
}

// DeepSeek-V3 (modeling_deepseek_v3.py): layer i has an MoE block when i >= first_k_dense_replace
// and i % moe_layer_freq == 0; routing is noaux_tc grouped top-k over sigmoid scores.
Status deepseek_fields(const Reader& r, const std::string& where, MoeModelConfig* c) {
  std::string scoring = "sigmoid", method = "noaux_tc";
  QMOE_RETURN_IF_ERROR(r.string("scoring_func", &scoring));
  QMOE_RETURN_IF_ERROR(r.string("topk_method", &method));
  if (scoring != "sigmoid" || method != "noaux_tc") {
    return Status::unsupported(where + ": scoring_func '" + scoring + "' with topk_method '" +
                               method +
                               "' is not supported (sigmoid with noaux_tc, as DeepSeek-V3)");
  }
  int64_t groups = 1, topk_groups = 1, first_dense = 0, freq = 1;
  QMOE_RETURN_IF_ERROR(r.positive("n_group", &groups));
  QMOE_RETURN_IF_ERROR(r.positive("topk_group", &topk_groups));
  QMOE_RETURN_IF_ERROR(r.integer("n_shared_experts", &c->n_shared, false));
  QMOE_RETURN_IF_ERROR(r.integer("first_k_dense_replace", &first_dense, false));
  QMOE_RETURN_IF_ERROR(r.integer("moe_layer_freq", &freq, false));
  if (c->n_shared < 0 || c->n_shared > c->num_experts || first_dense < 0 || freq < 1) {
    return Status::invalid(where +
                           ": n_shared_experts (0 .. n_routed_experts), first_k_dense_replace "
                           "(>= 0) or moe_layer_freq (>= 1) out of range");
  }
  c->shared_inter = c->n_shared * c->inter;  // mlp.shared_experts: one MLP of n_shared * I rows
  double scaling = 1.0;
  QMOE_RETURN_IF_ERROR(r.number("routed_scaling_factor", &scaling));
  c->n_group = static_cast<int>(groups);
  c->topk_group = static_cast<int>(topk_groups);
  c->routed_scaling_factor = static_cast<float>(scaling);
  c->normalize = true;
  QMOE_RETURN_IF_ERROR(r.boolean("norm_topk_prob", &c->normalize));
  for (int64_t i = first_dense; i < c->num_layers; ++i) {
    if (i % freq == 0) c->moe_layers.push_back(static_cast<int>(i));
  }
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

// Llama-4: the layers listed in moe_layers, or else every interleave_moe_layer_step-th layer
// counted from step - 1 (Llama4TextConfig's rule).
Status llama4_layers(const Json& j, const Reader& r, const std::string& where, MoeModelConfig* c) {
  auto it = j.find("moe_layers");
  if (it == j.end() || it->is_null()) {
    int64_t step = 1;
    QMOE_RETURN_IF_ERROR(r.integer("interleave_moe_layer_step", &step, false));
    if (step <= 0) {
      return Status::invalid(where +
                             ": 'interleave_moe_layer_step': expected a positive integer, got " +
                             std::to_string(step));
    }
    for (int64_t i = step - 1; i < c->num_layers; i += step) {
      c->moe_layers.push_back(static_cast<int>(i));
    }
    return Status::ok();
  }
  const Status bad =
      Status::invalid(where + ": 'moe_layers': expected a list of layer indices below " +
                      std::to_string(c->num_layers) + ", got " + it->dump());
  if (!it->is_array()) return bad;
  std::set<int64_t> layers;
  for (const Json& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c->num_layers) {
      return bad;
    }
    layers.insert(v.get<int64_t>());
  }
  for (int64_t i : layers) c->moe_layers.push_back(static_cast<int>(i));
  return Status::ok();
}

}  // namespace

Status parse_model_config(const std::string& json_text, const std::string& where,
                          MoeModelConfig* out) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid(where + ": not valid JSON");
  if (!j.is_object()) return Status::invalid(where + ": expected a JSON object");
  MoeModelConfig c;
  QMOE_RETURN_IF_ERROR(Reader(j, where).string("model_type", &c.model_type));
  static const std::pair<const char*, MoeArch> kTypes[] = {
      {"qwen3_moe", MoeArch::kQwen3Moe},     {"mixtral", MoeArch::kMixtral},
      {"deepseek_v3", MoeArch::kDeepseekV3}, {"gpt_oss", MoeArch::kGptOss},
      {"phimoe", MoeArch::kPhiMoe},          {"qwen2_moe", MoeArch::kQwen2Moe},
      {"llama4", MoeArch::kLlama4},          {"llama4_text", MoeArch::kLlama4}};
  auto type = std::find_if(std::begin(kTypes), std::end(kTypes),
                           [&](const auto& t) { return c.model_type == t.first; });
  if (type == std::end(kTypes)) {
    return Status::unsupported(where + ": model_type '" + c.model_type +
                               "' is not supported (qwen3_moe, qwen2_moe, mixtral, deepseek_v3, "
                               "gpt_oss, phimoe, llama4, llama4_text)");
  }
  c.arch = type->second;
  // Llama-4's multimodal config keeps the decoder's fields in text_config.
  const Json* text = &j;
  std::string tw = where;
  if (c.model_type == "llama4") {
    auto t = j.find("text_config");
    if (t == j.end() || !t->is_object()) {
      return Status::invalid(where +
                             ": missing 'text_config' (an object: model_type llama4 keeps the "
                             "decoder's fields there)");
    }
    text = &*t;
    tw = where + ": text_config";
  }
  const Reader r(*text, tw);
  const bool qwen = c.arch == MoeArch::kQwen3Moe || c.arch == MoeArch::kQwen2Moe;
  const bool deepseek = c.arch == MoeArch::kDeepseekV3;
  QMOE_RETURN_IF_ERROR(r.positive("hidden_size", &c.hidden));
  QMOE_RETURN_IF_ERROR(
      r.positive(qwen || deepseek ? "moe_intermediate_size" : "intermediate_size", &c.inter));
  QMOE_RETURN_IF_ERROR(
      r.positive(qwen ? "num_experts" : (deepseek ? "n_routed_experts" : "num_local_experts"),
                 &c.num_experts));
  int64_t k = 0;
  QMOE_RETURN_IF_ERROR(r.positive("num_experts_per_tok", &k));
  if (k > c.num_experts) {
    return Status::invalid(tw + ": num_experts_per_tok " + std::to_string(k) +
                           " exceeds the expert count " + std::to_string(c.num_experts));
  }
  c.top_k = static_cast<int>(k);
  QMOE_RETURN_IF_ERROR(r.positive("num_hidden_layers", &c.num_layers));
  std::string act = "silu";
  QMOE_RETURN_IF_ERROR(r.string("hidden_act", &act));
  if (act != "silu") {
    return Status::unsupported(tw + ": hidden_act '" + act + "' is not supported (silu)");
  }
  if (qwen) {
    c.normalize = false;  // Qwen3MoeConfig's and Qwen2MoeConfig's default
    QMOE_RETURN_IF_ERROR(r.boolean("norm_topk_prob", &c.normalize));
    QMOE_RETURN_IF_ERROR(qwen3_layers(*text, r, tw, &c));
    if (c.arch == MoeArch::kQwen2Moe) {
      QMOE_RETURN_IF_ERROR(r.positive("shared_expert_intermediate_size", &c.shared_inter));
      if (c.shared_inter % c.inter != 0) {
        return Status::unsupported(
            tw + ": shared_expert_intermediate_size " + std::to_string(c.shared_inter) +
            " is not a multiple of moe_intermediate_size " + std::to_string(c.inter) +
            ": the shared expert cannot be split into experts of the routed experts' size");
      }
    }
  } else if (deepseek) {
    QMOE_RETURN_IF_ERROR(deepseek_fields(r, where, &c));
  } else if (c.arch == MoeArch::kLlama4) {
    QMOE_RETURN_IF_ERROR(llama4_layers(*text, r, tw, &c));
    c.shared_inter = c.inter;  // Llama4TextMLP(config): intermediate_size rows
  } else {
    if (c.arch == MoeArch::kGptOss) {
      double limit = c.swiglu_limit;
      QMOE_RETURN_IF_ERROR(r.number("swiglu_limit", &limit));
      if (!(limit > 0) || limit > 1e30) {
        return Status::invalid(where + ": 'swiglu_limit': expected a positive number");
      }
      c.swiglu_limit = static_cast<float>(limit);
    }
    if (c.arch == MoeArch::kPhiMoe) {
      double jitter = c.router_jitter;
      QMOE_RETURN_IF_ERROR(r.number("router_jitter_noise", &jitter));
      if (!(jitter >= 0) || jitter > 1e30) {
        return Status::invalid(where + ": 'router_jitter_noise': expected a number >= 0");
      }
      if (c.top_k != 2) {
        return Status::unsupported(where + ": num_experts_per_tok " + std::to_string(c.top_k) +
                                   " with phimoe: the sparse mixer routes exactly 2 experts");
      }
      c.router_jitter = static_cast<float>(jitter);
    }
    for (int64_t i = 0; i < c.num_layers; ++i) c.moe_layers.push_back(static_cast<int>(i));
  }
  auto q = j.find("quantization_config");
  if (q != j.end() && !q->is_null()) {
    if (!q->is_object()) return Status::invalid(where + ": 'quantization_config': not an object");
    std::string& method = c.quant_method;
    QMOE_RETURN_IF_ERROR(
        Reader(*q, where + ": quantization_config").string("quant_method", &method));
    if (method == "gptq") {
      QMOE_RETURN_IF_ERROR(parse_gptq(*q, where, &c.gptq));
    } else if (method == "awq") {
      QMOE_RETURN_IF_ERROR(parse_awq(*q, where, &c.awq));
    } else if (method == "compressed-tensors") {
      QMOE_RETURN_IF_ERROR(parse_compressed_tensors(*q, where, &c.ct));
    } else if (method == "fp8") {
      QMOE_RETURN_IF_ERROR(parse_fp8(*q, where, &c.fp8));
    } else if (method == "mxfp4") {
      c.mxfp4 = true;
    } else if (method == "modelopt") {
      QMOE_RETURN_IF_ERROR(parse_modelopt(*q, where));
      c.nvfp4 = true;
    } else {
      return Status::unsupported(where + ": quantization_config.quant_method '" + method +
                                 "' is not supported (gptq, awq, compressed-tensors, fp8, mxfp4, "
                                 "modelopt)");
    }
  }
  *out = std::move(c);
  return Status::ok();
}

namespace convert {

Status parse_hf_quant_config(const std::string& json_text, const std::string& where,
                             MoeModelConfig* c) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid(where + ": not valid JSON");
  auto q = j.is_object() ? j.find("quantization") : j.end();
  if (q == j.end() || !q->is_object()) {
    return Status::invalid(where + ": missing 'quantization' (an object with quant_algo)");
  }
  QMOE_RETURN_IF_ERROR(parse_modelopt(*q, where));
  c->quant_method = "modelopt";
  c->nvfp4 = true;
  return Status::ok();
}

}  // namespace convert

LayerSpec moe_layer_spec(const MoeModelConfig& c, const FcFormat& fc1, const FcFormat& fc2) {
  LayerSpec s;
  s.hidden = c.hidden;
  s.inter = c.inter;
  // The shared experts follow the routed ones, with router columns of their own (routing spec).
  s.num_experts = c.num_experts + c.num_shared();
  s.routing.num_shared = static_cast<int>(c.num_shared());
  s.activation.kind = Activation::kSwiGlu;  // silu(gate) * up: alpha 1, beta 0, no limit
  s.activation.glu = GluLayout::kInterleaved;
  s.routing.top_k = c.top_k;
  if (c.arch == MoeArch::kQwen3Moe || c.arch == MoeArch::kQwen2Moe) {
    // softmax over all (routed) experts in fp32, top-k, renormalized when norm_topk_prob.
    // Qwen2-MoE's shared expert is weighted by sigmoid(x . shared_expert_gate): qmoe's shared
    // experts' rule, with the gate as their router column.
    s.routing.method = RoutingMethod::kSoftmaxTopK;
    s.routing.normalize = c.normalize;
  } else if (c.arch == MoeArch::kLlama4) {
    // top-k of the logits, each weighted by sigmoid(logit), the weight scaling the expert's
    // input (Llama4TextMoe: routed_in = x * score); the shared expert added with weight 1.
    s.routing.shared_weight = SharedWeight::kOne;
    s.routing.method = RoutingMethod::kTopKSigmoid;
    s.routing.combine = CombineMode::kScaleInput;
  } else if (c.arch == MoeArch::kPhiMoe) {
    // PhiMoE's sparsemixer at inference: two experts, each weighted by a softmax over the logits
    // within 2 eps (relative) of its maximum.
    s.routing.method = RoutingMethod::kSparseMixer;
    s.routing.sparse_mixer_eps = c.router_jitter;
  } else if (c.arch == MoeArch::kGptOss) {
    // top-k of the (biased) logits, softmax over the k; both FCs biased; the clamped SwiGLU
    // (up + 1) * g * sigmoid(1.702 g), g = min(gate, limit), up clamped to [-limit, limit].
    s.routing.method = RoutingMethod::kTopKSoftmax;
    s.routing.normalize = false;
    s.activation.alpha = 1.702f;
    s.activation.beta = 1.0f;
    s.activation.limit = c.swiglu_limit;
    s.has_fc1_bias = s.has_fc2_bias = true;
  } else if (c.arch == MoeArch::kDeepseekV3) {
    // sigmoid scores + e_score_correction_bias, best topk_group of n_group groups, top-k, weights
    // renormalized (norm_topk_prob) and scaled; the shared experts added with weight 1.
    s.routing.shared_weight = SharedWeight::kOne;
    s.routing.method = RoutingMethod::kGroupedTopK;
    s.routing.normalize = c.normalize;
    s.routing.n_group = c.n_group;
    s.routing.topk_group = c.topk_group;
    s.routing.routed_scaling_factor = c.routed_scaling_factor;
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
  for (SourceFormat f : {SourceFormat::kBf16, SourceFormat::kFp16, SourceFormat::kFp32,
                         SourceFormat::kGptq, SourceFormat::kAwq, SourceFormat::kCompressedTensors,
                         SourceFormat::kFp8, SourceFormat::kMxfp4, SourceFormat::kNvfp4}) {
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
    case SourceFormat::kAwq:
      return "awq";
    case SourceFormat::kCompressedTensors:
      return "compressed-tensors";
    case SourceFormat::kFp8:
      return "fp8";
    case SourceFormat::kMxfp4:
      return "mxfp4";
    case SourceFormat::kNvfp4:
      return "nvfp4";
  }
  return "?";
}

}  // namespace qmoe

#include "io/layer_metadata.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "qmoe/io.h"

namespace qmoe {

namespace {

constexpr const char* kKnownKeys =
    "qmoe.format_version, qmoe.ort_semantics, qmoe.routing_method, qmoe.n_group, "
    "qmoe.topk_group, qmoe.routed_scaling_factor, qmoe.sparse_mixer_eps, qmoe.tie_break, "
    "qmoe.combine, qmoe.shared_weight, qmoe.fp4_layout, qmoe.num_experts, qmoe.first_expert";

std::string float_string(float v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);  // 9 significant digits round-trip any float
  return buf;
}

Status bad_value(const std::string& key, const std::string& expected, const std::string& v) {
  return Status::invalid("metadata " + key + ": expected " + expected + ", got '" + v + "'");
}

Status parse_int(const std::string& key, const std::string& v, int* out, int lowest = 1) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lowest || x > (1 << 20)) {
    return bad_value(key, lowest == 0 ? "an integer >= 0" : "a positive integer", v);
  }
  *out = static_cast<int>(x);
  return Status::ok();
}

Status parse_float(const std::string& key, const std::string& v, float* out) {
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x)) return bad_value(key, "a finite number", v);
  *out = x;
  return Status::ok();
}

// Parses one of two spellings into the first or second value.
template <typename T>
Status parse_choice(const std::string& key, const std::string& v, const char* a, T va,
                    const char* b, T vb, T* out) {
  if (v == a) {
    *out = va;
  } else if (v == b) {
    *out = vb;
  } else {
    return bad_value(key, std::string(a) + " or " + b, v);
  }
  return Status::ok();
}

Status same_quant_type(const char* what, const FcFormat& a, const FcFormat& b) {
  if (std::string(a.info().ort_quant_type) != b.info().ort_quant_type ||
      (a.info().kind != FormatKind::kInteger && a.format != b.format)) {
    return Status::unsupported(std::string("layer file: ") + what + " format " + b.to_string() +
                               " differs in kind from fc1's " + a.to_string() +
                               "; ORT's single quant_type attribute cannot express that");
  }
  if (a.block_size != b.block_size) {
    return Status::unsupported(std::string("layer file: ") + what + " block size " +
                               std::to_string(b.block_size) + " differs from fc1's " +
                               std::to_string(a.block_size) +
                               "; ORT's single block_size attribute cannot express that");
  }
  if (a.info().kind == FormatKind::kFp4 && a.fp4_layout != b.fp4_layout) {
    return Status::unsupported(std::string("layer file: ") + what +
                               " FP4 layout differs from fc1's; one weights_prepacked attribute "
                               "cannot express that");
  }
  return Status::ok();
}

}  // namespace

Status parse_layer_extensions(const std::map<std::string, std::string>& metadata,
                              LayerFileExtensions* out) {
  LayerFileExtensions e;
  for (const auto& kv : metadata) {
    const std::string& key = kv.first;
    const std::string& v = kv.second;
    if (key.rfind("qmoe.", 0) != 0) continue;
    if (key == "qmoe.format_version") {
      if (v != kLayerFileFormatVersion) {
        return Status::unsupported("metadata qmoe.format_version: this build reads version " +
                                   std::string(kLayerFileFormatVersion) + ", got '" + v + "'");
      }
    } else if (key == "qmoe.ort_semantics") {
      QMOE_RETURN_IF_ERROR(parse_choice(key, v, "cuda", OrtSemantics::kCuda, "cpu",
                                        OrtSemantics::kCpu, &e.semantics));
    } else if (key == "qmoe.routing_method") {
      if (!parse_routing_method(v, &e.method)) {
        return bad_value(key,
                         "softmax_topk, topk_softmax, sparse_mixer, grouped_topk or "
                         "topk_sigmoid",
                         v);
      }
      e.has_method = true;
    } else if (key == "qmoe.n_group") {
      QMOE_RETURN_IF_ERROR(parse_int(key, v, &e.n_group));
      e.has_n_group = true;
    } else if (key == "qmoe.topk_group") {
      QMOE_RETURN_IF_ERROR(parse_int(key, v, &e.topk_group));
      e.has_topk_group = true;
    } else if (key == "qmoe.routed_scaling_factor") {
      QMOE_RETURN_IF_ERROR(parse_float(key, v, &e.routed_scaling_factor));
      e.has_scaling = true;
    } else if (key == "qmoe.sparse_mixer_eps") {
      QMOE_RETURN_IF_ERROR(parse_float(key, v, &e.sparse_mixer_eps));
      e.has_eps = true;
    } else if (key == "qmoe.tie_break") {
      QMOE_RETURN_IF_ERROR(parse_choice(key, v, "lower", TieBreak::kLowerIndex, "higher",
                                        TieBreak::kHigherIndex, &e.ties));
      e.has_ties = true;
    } else if (key == "qmoe.combine") {
      QMOE_RETURN_IF_ERROR(parse_choice(key, v, "output", CombineMode::kScaleOutput, "input",
                                        CombineMode::kScaleInput, &e.combine));
      e.has_combine = true;
    } else if (key == "qmoe.shared_weight") {
      QMOE_RETURN_IF_ERROR(parse_choice(key, v, "sigmoid", SharedWeight::kSigmoid, "one",
                                        SharedWeight::kOne, &e.shared_weight));
      e.has_shared_weight = true;
    } else if (key == "qmoe.fp4_layout") {
      QMOE_RETURN_IF_ERROR(parse_choice(key, v, "n_packed", Fp4Layout::kNPacked, "k_packed",
                                        Fp4Layout::kKPacked, &e.fp4_layout));
      e.has_fp4_layout = true;
    } else if (key == "qmoe.num_experts") {
      QMOE_RETURN_IF_ERROR(parse_int(key, v, &e.num_experts));
      e.has_num_experts = true;
    } else if (key == "qmoe.first_expert") {
      QMOE_RETURN_IF_ERROR(parse_int(key, v, &e.first_expert, 0));
    } else {
      return Status::invalid("metadata: unknown key '" + key + "' (known qmoe keys: " + kKnownKeys +
                             ")");
    }
  }
  *out = e;
  return Status::ok();
}

void apply_layer_extensions(const LayerFileExtensions& e, LayerSpec* spec) {
  RoutingSpec& r = spec->routing;
  if (e.has_method) r.method = e.method;
  if (e.has_n_group) r.n_group = e.n_group;
  if (e.has_topk_group) r.topk_group = e.topk_group;
  if (e.has_scaling) r.routed_scaling_factor = e.routed_scaling_factor;
  if (e.has_eps) r.sparse_mixer_eps = e.sparse_mixer_eps;
  if (e.has_ties) r.ties = e.ties;
  if (e.has_combine) r.combine = e.combine;
  if (e.has_shared_weight) r.shared_weight = e.shared_weight;
  if (e.has_num_experts && e.num_experts != spec->num_experts) {
    spec->local_experts = spec->num_experts;
    spec->num_experts = e.num_experts;
  }
  spec->first_expert = e.first_expert;
}

Status ort_attributes_for_spec(const LayerSpec& s, OrtQMoEAttributes* out) {
  OrtQMoEAttributes a;
  QMOE_RETURN_IF_ERROR(same_quant_type("fc2", s.fc1, s.fc2));
  if (s.has_fc3()) {
    QMOE_RETURN_IF_ERROR(same_quant_type("fc3", s.fc1, s.fc3));
    if (s.fc3.info().global_scale_required) {
      return Status::unsupported("layer file: fc3 format " + s.fc3.to_string() +
                                 " needs a global scale, and ORT defines no fc3_global_scale");
    }
  }
  a.k = s.routing.top_k;
  a.activation_type = activation_name(s.activation.kind);
  a.normalize_routing_weights = s.routing.normalize ? 1 : 0;
  a.use_sparse_mixer = s.routing.method == RoutingMethod::kSparseMixer ? 1 : 0;
  a.swiglu_fusion = s.activation.gated() ? static_cast<int64_t>(s.activation.glu) : 0;
  a.swiglu_limit = s.activation.limit;
  a.swiglu_limit_after_activation = s.activation.limit_after_activation ? 1 : 0;
  a.activation_alpha = s.activation.alpha;
  a.activation_beta = s.activation.beta;
  a.expert_weight_bits = s.fc1.bits();
  if (s.fc2.bits() != s.fc1.bits()) a.fc2_expert_weight_bits = s.fc2.bits();
  if (s.has_fc3() && s.fc3.bits() != s.fc1.bits()) a.fc3_expert_weight_bits = s.fc3.bits();
  a.quant_type = s.fc1.info().ort_quant_type;
  a.block_size = s.fc1.block_size;
  // 0 = ORT's raw layout for integers; for FP4, 0 = N-packed and 1 = K-packed.
  a.weights_prepacked =
      (s.fc1.info().kind == FormatKind::kFp4 && s.fc1.fp4_layout == Fp4Layout::kKPacked) ? 1 : 0;
  a.num_shared_experts = s.routing.num_shared;
  *out = a;
  return Status::ok();
}

std::map<std::string, std::string> layer_extension_keys(const LayerSpec& s) {
  const RoutingSpec& r = s.routing;
  std::map<std::string, std::string> m;
  m["qmoe.format_version"] = kLayerFileFormatVersion;
  m["qmoe.ort_semantics"] = "cuda";
  m["qmoe.routing_method"] = routing_method_name(r.method);
  m["qmoe.tie_break"] = r.ties == TieBreak::kLowerIndex ? "lower" : "higher";
  m["qmoe.combine"] = r.combine == CombineMode::kScaleOutput ? "output" : "input";
  if (r.num_shared > 0) m["qmoe.shared_weight"] = shared_weight_name(r.shared_weight);
  if (r.method == RoutingMethod::kGroupedTopK) {
    m["qmoe.n_group"] = std::to_string(r.n_group);
    m["qmoe.topk_group"] = std::to_string(r.topk_group);
    m["qmoe.routed_scaling_factor"] = float_string(r.routed_scaling_factor);
  }
  if (r.method == RoutingMethod::kSparseMixer) {
    m["qmoe.sparse_mixer_eps"] = float_string(r.sparse_mixer_eps);
  }
  if (s.sharded() || s.first_expert != 0) {
    m["qmoe.num_experts"] = std::to_string(s.num_experts);
    m["qmoe.first_expert"] = std::to_string(s.first_expert);
  }
  if (s.fc1.info().kind == FormatKind::kFp4) {
    m["qmoe.fp4_layout"] = s.fc1.fp4_layout == Fp4Layout::kKPacked ? "k_packed" : "n_packed";
  }
  return m;
}

}  // namespace qmoe

// ONNX Runtime com.microsoft::QMoE import: attributes and raw inputs -> LayerSpec + LayerWeights.
// The dimension rules follow ORT: E from fc1's first dimension, H from the input (or, for a
// weights-only layer file, from fc2), I from FC1's row count divided by the fusion factor.
#include "qmoe/ort.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace qmoe {

namespace {

constexpr const char* kOrtInputNames[kNumOrtInputs] = {
    "input",
    "router_probs",
    "fc1_experts_weights",
    "fc1_scales",
    "fc1_experts_bias",
    "fc2_experts_weights",
    "fc2_scales",
    "fc2_experts_bias",
    "fc3_experts_weights",
    "fc3_scales",
    "fc3_experts_bias",
    "fc1_zero_points",
    "fc2_zero_points",
    "fc3_zero_points",
    "router_weights",
    "fc1_global_scale",
    "fc2_global_scale",
    "fc1_act_scale",
    "fc2_act_scale",
    "fc1_act_block_scale",
    "fc2_act_block_scale",
};

Status int_format_for_bits(int64_t bits, const char* attr, WeightFormat* f) {
  switch (bits) {
    case 2:
      *f = WeightFormat::kInt2;
      return Status::ok();
    case 3:
      *f = WeightFormat::kInt3;
      return Status::ok();
    case 4:
      *f = WeightFormat::kInt4;
      return Status::ok();
    case 8:
      *f = WeightFormat::kInt8;
      return Status::ok();
    default:
      return Status::invalid(std::string(attr) + ": expected 2, 3, 4 or 8, got " +
                             std::to_string(bits));
  }
}

// The FcFormat of one projection. `bits_attr` is the effective width for integer formats.
Status fc_format_from_ort(const OrtQMoEAttributes& a, int64_t bits, const char* bits_name,
                          const TensorView& scales, const TensorView& zero_points, const char* fc,
                          FcFormat* f) {
  const std::string q = a.quant_type;
  const std::string p(fc);
  if (q == "int") {
    QMOE_RETURN_IF_ERROR(int_format_for_bits(bits, bits_name, &f->format));
    if (a.weights_prepacked == 1) {
      return Status::unsupported(
          "weights_prepacked: 1 selects an execution provider's private integer layout; qmoe "
          "reads ORT's raw layout [E, N, K*bits/8] (weights_prepacked = 0 or -1)");
    }
    f->block_size = a.block_size > 0 ? static_cast<int>(a.block_size) : 0;
    f->zero_points = zero_points.present();
    f->scale_dtype = scales.present() ? scales.dtype : DType::kF32;
  } else if (q == "nvfp4" || q == "fp4") {
    const bool nv = q == "nvfp4";
    f->format = nv ? WeightFormat::kNvFp4 : WeightFormat::kMxFp4;
    f->block_size = nv ? 16 : 32;  // ORT normalizes the FP4 block sizes whatever the attribute
    f->scale_dtype = nv ? DType::kF8E4M3 : DType::kF8E8M0;
    f->fp4_layout = a.weights_prepacked == 1 ? Fp4Layout::kKPacked : Fp4Layout::kNPacked;
    if (zero_points.present()) {
      return Status::invalid(p + "_zero_points: zero points are only defined for quant_type int");
    }
  } else if (q == "fp8") {
    f->format = a.block_size > 0 ? WeightFormat::kFp8Block : WeightFormat::kFp8;
    f->block_size = a.block_size > 0 ? static_cast<int>(a.block_size) : 0;
    f->scale_dtype = scales.present() ? scales.dtype : DType::kF32;
    if (zero_points.present()) {
      return Status::invalid(p + "_zero_points: zero points are only defined for quant_type int");
    }
  } else if (q == "wfp4afp8") {
    return Status::unsupported(
        "quant_type: wfp4afp8 (MXFP4 weights with FP8 activations) is not supported; MXFP4 "
        "weights run with quant_type fp4");
  } else {
    return Status::invalid("quant_type: expected int, fp4, nvfp4 or fp8, got '" + q + "'");
  }
  return Status::ok();
}

// Logical rows of FC1 (F * I) from its weight tensor, per the format's layout.
int64_t fc_rows_from_weight(const FcFormat& f, const TensorView& w) {
  if (w.rank != 3) return -1;
  if (f.info().kind == FormatKind::kFp4 && f.fp4_layout == Fp4Layout::kNPacked) {
    return 2 * w.dims[2];
  }
  return w.dims[1];
}

std::string float_string(float v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

Status parse_int(const std::string& key, const std::string& v, int64_t* out) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') {
    return Status::invalid(key + ": expected an integer, got '" + v + "'");
  }
  *out = x;
  return Status::ok();
}

Status parse_float(const std::string& key, const std::string& v, float* out) {
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);  // accepts "inf"
  if (v.empty() || *end != '\0') {
    return Status::invalid(key + ": expected a number, got '" + v + "'");
  }
  *out = x;
  return Status::ok();
}

}  // namespace

const char* ort_input_name(int index) {
  return (index >= 0 && index < kNumOrtInputs) ? kOrtInputNames[index] : "?";
}

Status layer_from_ort(const OrtQMoEAttributes& a, const TensorView* in,
                      const OrtImportOptions& options, LayerSpec* spec, LayerWeights* weights) {
  LayerSpec s;
  LayerWeights w;
  for (int i : {kOrtFc1ActScale, kOrtFc2ActScale, kOrtFc1ActBlockScale, kOrtFc2ActBlockScale}) {
    if (in[i].present()) {
      return Status::unsupported(std::string(ort_input_name(i)) +
                                 ": FP8 activation quantization (wfp4afp8) is not supported");
    }
  }

  // Activation.
  if (!parse_activation(a.activation_type, &s.activation.kind)) {
    return Status::invalid(
        "activation_type: expected relu, gelu, silu, swiglu, geglu or "
        "identity, got '" +
        a.activation_type + "'");
  }
  if (s.activation.gated()) {
    if (a.swiglu_fusion < 0 || a.swiglu_fusion > 2) {
      return Status::invalid("swiglu_fusion: expected 0, 1 or 2, got " +
                             std::to_string(a.swiglu_fusion));
    }
    s.activation.glu = static_cast<GluLayout>(a.swiglu_fusion);
  }
  s.activation.alpha = a.activation_alpha;
  s.activation.beta = a.activation_beta;
  s.activation.limit = a.swiglu_limit;
  s.activation.limit_after_activation = a.swiglu_limit_after_activation != 0;

  // Routing.
  if (a.k < 1 || a.k > 1 << 20)
    return Status::invalid("k: expected >= 1, got " + std::to_string(a.k));
  s.routing.top_k = static_cast<int>(a.k);
  s.routing.normalize = a.normalize_routing_weights != 0;
  if (a.num_shared_experts < 0 || a.num_shared_experts > 1 << 16) {
    return Status::invalid("num_shared_experts: expected >= 0, got " +
                           std::to_string(a.num_shared_experts));
  }
  s.routing.num_shared = static_cast<int>(a.num_shared_experts);
  if (a.use_sparse_mixer) {
    s.routing.method = RoutingMethod::kSparseMixer;
  } else if (options.semantics == OrtSemantics::kCpu) {
    s.routing.method = RoutingMethod::kTopKSoftmax;
    s.routing.ties = TieBreak::kHigherIndex;
    // A softmax over the k selected is normalized by construction; normalize_routing_weights
    // still governs gathered router_weights, as in ORT's CPU kernel.
  } else {
    s.routing.method = RoutingMethod::kSoftmaxTopK;
  }

  // Formats.
  const TensorView& fc1w = in[kOrtFc1Weights];
  const TensorView& fc2w = in[kOrtFc2Weights];
  if (!fc1w.present() || fc1w.rank != 3) {
    return Status::invalid("fc1_experts_weights: expected a rank-3 tensor [E, N, ...], got " +
                           (fc1w.present() ? fc1w.shape_string() : std::string("nothing")));
  }
  if (!fc2w.present() || fc2w.rank != 3) {
    return Status::invalid("fc2_experts_weights: expected a rank-3 tensor [E, N, ...], got " +
                           (fc2w.present() ? fc2w.shape_string() : std::string("nothing")));
  }
  auto inherit = [&](int64_t v) { return v > 0 ? v : a.expert_weight_bits; };
  QMOE_RETURN_IF_ERROR(fc_format_from_ort(a, inherit(a.fc1_expert_weight_bits),
                                          "fc1_expert_weight_bits", in[kOrtFc1Scales],
                                          in[kOrtFc1ZeroPoints], "fc1", &s.fc1));
  QMOE_RETURN_IF_ERROR(fc_format_from_ort(a, inherit(a.fc2_expert_weight_bits),
                                          "fc2_expert_weight_bits", in[kOrtFc2Scales],
                                          in[kOrtFc2ZeroPoints], "fc2", &s.fc2));
  const bool separate_fc3 = s.activation.gated() && s.activation.glu == GluLayout::kSeparateFc3;
  if (separate_fc3) {
    if (!in[kOrtFc3Weights].present()) {
      return Status::invalid(
          "fc3_experts_weights: missing; swiglu_fusion = 0 takes the linear "
          "half from a separate FC3 (use 1 or 2 when FC1 holds both halves)");
    }
    QMOE_RETURN_IF_ERROR(fc_format_from_ort(a, inherit(a.fc3_expert_weight_bits),
                                            "fc3_expert_weight_bits", in[kOrtFc3Scales],
                                            in[kOrtFc3ZeroPoints], "fc3", &s.fc3));
    if (s.fc3.info().global_scale_required) {
      return Status::unsupported(
          "fc3_experts_weights: ORT defines no fc3_global_scale, so a "
          "separate FC3 cannot use format " +
          s.fc3.to_string());
    }
  } else if (s.activation.gated() && a.fc3_expert_weight_bits > 0 &&
             a.fc3_expert_weight_bits != inherit(a.fc1_expert_weight_bits)) {
    return Status::invalid(
        "fc3_expert_weight_bits: with fused SwiGLU FC3 lives in FC1 and must "
        "equal fc1's width " +
        std::to_string(inherit(a.fc1_expert_weight_bits)) + ", got " +
        std::to_string(a.fc3_expert_weight_bits));
  }

  // Dimensions.
  s.num_experts = fc1w.dims[0];
  const int64_t f = (s.activation.gated() && !separate_fc3) ? 2 : 1;
  const int64_t fc1_rows = fc_rows_from_weight(s.fc1, fc1w);
  if (fc1_rows % f != 0) {
    return Status::invalid(
        "fc1_experts_weights: fused gated activation needs an even row count "
        "2 * inter_size, got " +
        std::to_string(fc1_rows));
  }
  s.inter = fc1_rows / f;
  const TensorView& x = in[kOrtInput];
  if (x.given()) {  // an empty input ([0, H]) may come with a null pointer and still gives H
    if (x.rank != 2 && x.rank != 3) {
      return Status::invalid("input: expected [tokens, H] or [batch, seq, H], got " +
                             x.shape_string());
    }
    s.hidden = x.dims[x.rank - 1];
    s.act_dtype = x.dtype;
  } else {
    // FC2 is [E, H, ...] (N-packed FP4: [E, I, H/2]).
    s.hidden = (s.fc2.info().kind == FormatKind::kFp4 && s.fc2.fp4_layout == Fp4Layout::kNPacked)
                   ? 2 * fc2w.dims[2]
                   : fc2w.dims[1];
    const TensorView& b = in[kOrtFc1Bias];
    s.act_dtype = b.present() ? b.dtype : DType::kF32;
  }
  const TensorView& logits = in[kOrtRouterProbs];
  if (logits.given()) {
    if (logits.rank != 2) {
      return Status::invalid("router_probs: expected [tokens, E], got " + logits.shape_string());
    }
    // More router columns than weight experts is expert parallelism: the weights hold experts
    // [first_expert, first_expert + fc1 experts) of the router's E (check_layer validates the
    // range).
    if (logits.dims[1] < s.num_experts) {
      return Status::invalid("router_probs: has " + std::to_string(logits.dims[1]) +
                             " expert columns but fc1_experts_weights holds " +
                             std::to_string(s.num_experts) +
                             " experts; expected at least as many columns as experts");
    }
    if (logits.dims[1] > s.num_experts) {
      s.local_experts = s.num_experts;
      s.num_experts = logits.dims[1];
    }
  }
  s.first_expert = options.first_expert;

  // Weights.
  w.fc1 = {fc1w, in[kOrtFc1Scales], in[kOrtFc1Bias], in[kOrtFc1ZeroPoints], in[kOrtFc1GlobalScale]};
  w.fc2 = {fc2w, in[kOrtFc2Scales], in[kOrtFc2Bias], in[kOrtFc2ZeroPoints], in[kOrtFc2GlobalScale]};
  if (separate_fc3) {
    w.fc3 = {in[kOrtFc3Weights], in[kOrtFc3Scales], in[kOrtFc3Bias], in[kOrtFc3ZeroPoints],
             TensorView()};
  } else if (in[kOrtFc3Weights].present() || in[kOrtFc3Scales].present() ||
             in[kOrtFc3Bias].present()) {
    return Status::invalid(
        "fc3_experts_weights: FC3 inputs are used only by swiglu with "
        "swiglu_fusion = 0");
  }
  s.has_fc1_bias = w.fc1.bias.present();
  s.has_fc2_bias = w.fc2.bias.present();
  s.has_fc3_bias = w.fc3.bias.present();
  QMOE_RETURN_IF_ERROR(check_layer(s, w));
  *spec = s;
  *weights = w;
  return Status::ok();
}

std::map<std::string, std::string> ort_attributes_to_map(const OrtQMoEAttributes& a) {
  std::map<std::string, std::string> m;
  m["k"] = std::to_string(a.k);
  m["activation_type"] = a.activation_type;
  m["normalize_routing_weights"] = std::to_string(a.normalize_routing_weights);
  m["use_sparse_mixer"] = std::to_string(a.use_sparse_mixer);
  m["swiglu_fusion"] = std::to_string(a.swiglu_fusion);
  m["swiglu_limit"] = float_string(a.swiglu_limit);
  m["swiglu_limit_after_activation"] = std::to_string(a.swiglu_limit_after_activation);
  m["activation_alpha"] = float_string(a.activation_alpha);
  m["activation_beta"] = float_string(a.activation_beta);
  m["expert_weight_bits"] = std::to_string(a.expert_weight_bits);
  if (a.fc1_expert_weight_bits > 0)
    m["fc1_expert_weight_bits"] = std::to_string(a.fc1_expert_weight_bits);
  if (a.fc2_expert_weight_bits > 0)
    m["fc2_expert_weight_bits"] = std::to_string(a.fc2_expert_weight_bits);
  if (a.fc3_expert_weight_bits > 0)
    m["fc3_expert_weight_bits"] = std::to_string(a.fc3_expert_weight_bits);
  m["block_size"] = std::to_string(a.block_size);
  m["quant_type"] = a.quant_type;
  m["weights_prepacked"] = std::to_string(a.weights_prepacked);
  m["accuracy_level"] = std::to_string(a.accuracy_level);
  m["num_shared_experts"] = std::to_string(a.num_shared_experts);
  return m;
}

Status ort_attributes_from_map(const std::map<std::string, std::string>& m,
                               OrtQMoEAttributes* out) {
  OrtQMoEAttributes a;
  for (const auto& [key, v] : m) {
    if (key.rfind("qmoe.", 0) == 0) continue;  // extension keys belong to the caller
    if (key == "activation_type")
      a.activation_type = v;
    else if (key == "quant_type")
      a.quant_type = v;
    else if (key == "swiglu_limit")
      QMOE_RETURN_IF_ERROR(parse_float(key, v, &a.swiglu_limit));
    else if (key == "activation_alpha")
      QMOE_RETURN_IF_ERROR(parse_float(key, v, &a.activation_alpha));
    else if (key == "activation_beta")
      QMOE_RETURN_IF_ERROR(parse_float(key, v, &a.activation_beta));
    else {
      int64_t* slot = nullptr;
      if (key == "k")
        slot = &a.k;
      else if (key == "normalize_routing_weights")
        slot = &a.normalize_routing_weights;
      else if (key == "use_sparse_mixer")
        slot = &a.use_sparse_mixer;
      else if (key == "swiglu_fusion")
        slot = &a.swiglu_fusion;
      else if (key == "swiglu_limit_after_activation")
        slot = &a.swiglu_limit_after_activation;
      else if (key == "expert_weight_bits")
        slot = &a.expert_weight_bits;
      else if (key == "fc1_expert_weight_bits")
        slot = &a.fc1_expert_weight_bits;
      else if (key == "fc2_expert_weight_bits")
        slot = &a.fc2_expert_weight_bits;
      else if (key == "fc3_expert_weight_bits")
        slot = &a.fc3_expert_weight_bits;
      else if (key == "block_size")
        slot = &a.block_size;
      else if (key == "weights_prepacked")
        slot = &a.weights_prepacked;
      else if (key == "accuracy_level")
        slot = &a.accuracy_level;
      else if (key == "num_shared_experts")
        slot = &a.num_shared_experts;
      if (!slot) return Status::invalid("attribute '" + key + "': not a QMoE attribute");
      QMOE_RETURN_IF_ERROR(parse_int(key, v, slot));
    }
  }
  *out = a;
  return Status::ok();
}

}  // namespace qmoe

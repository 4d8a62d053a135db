// Validation of LayerSpec, LayerWeights and per-call inputs. Every message names the argument and
// the expected value, so a caller (or a binding) can show it unchanged.
#include "qmoe/layer.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/numeric.h"
#include "core/tensor_check.h"

namespace qmoe {

namespace {

struct NamedEnum {
  int value;
  const char* name;
};

constexpr NamedEnum kActivations[] = {
    {static_cast<int>(Activation::kIdentity), "identity"},
    {static_cast<int>(Activation::kRelu), "relu"},
    {static_cast<int>(Activation::kGelu), "gelu"},
    {static_cast<int>(Activation::kSilu), "silu"},
    {static_cast<int>(Activation::kSwiGlu), "swiglu"},
    {static_cast<int>(Activation::kGeGlu), "geglu"},
};

constexpr NamedEnum kRoutingMethods[] = {
    {static_cast<int>(RoutingMethod::kSoftmaxTopK), "softmax_topk"},
    {static_cast<int>(RoutingMethod::kTopKSoftmax), "topk_softmax"},
    {static_cast<int>(RoutingMethod::kSparseMixer), "sparse_mixer"},
    {static_cast<int>(RoutingMethod::kGroupedTopK), "grouped_topk"},
    {static_cast<int>(RoutingMethod::kTopKSigmoid), "topk_sigmoid"},
};
constexpr NamedEnum kSharedWeights[] = {
    {static_cast<int>(SharedWeight::kSigmoid), "sigmoid"},
    {static_cast<int>(SharedWeight::kOne), "one"},
};

template <size_t N>
const char* enum_name(const NamedEnum (&table)[N], int v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <size_t N, typename E>
bool enum_parse(const NamedEnum (&table)[N], const std::string& s, E* out) {
  for (const auto& e : table) {
    if (s == e.name) {
      *out = static_cast<E>(e.value);
      return true;
    }
  }
  return false;
}

bool is_activation_dtype(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

std::string str(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Status check_routing(const LayerSpec& s) {
  const RoutingSpec& r = s.routing;
  if (r.num_shared < 0 || r.num_shared >= s.num_experts) {
    return Status::invalid("num_shared_experts: expected 0 <= value < num_experts = " +
                           std::to_string(s.num_experts) + ", got " + std::to_string(r.num_shared));
  }
  const int64_t routed = s.num_experts - r.num_shared;
  if (r.top_k < 1 || r.top_k > routed) {
    return Status::invalid("k: expected 1 <= k <= " + std::to_string(routed) +
                           " (routed experts), got " + std::to_string(r.top_k));
  }
  switch (r.method) {
    case RoutingMethod::kSparseMixer:
      if (r.top_k != 2) {
        return Status::invalid("k: sparse mixer routing requires k = 2, got " +
                               std::to_string(r.top_k));
      }
      if (!(r.sparse_mixer_eps >= 0.0f) || !std::isfinite(r.sparse_mixer_eps)) {
        return Status::invalid("sparse_mixer_eps: expected a finite value >= 0, got " +
                               str(r.sparse_mixer_eps));
      }
      break;
    case RoutingMethod::kGroupedTopK: {
      if (r.n_group < 1 || routed % r.n_group != 0) {
        return Status::invalid("n_group: expected a divisor of the " + std::to_string(routed) +
                               " routed experts, got " + std::to_string(r.n_group));
      }
      if (r.topk_group < 1 || r.topk_group > r.n_group) {
        return Status::invalid("topk_group: expected 1 <= topk_group <= n_group = " +
                               std::to_string(r.n_group) + ", got " + std::to_string(r.topk_group));
      }
      const int64_t reachable = routed / r.n_group * r.topk_group;
      if (r.top_k > reachable) {
        return Status::invalid("k: grouped top-k can reach only topk_group * group size = " +
                               std::to_string(reachable) +
                               " experts, got k = " + std::to_string(r.top_k));
      }
      if (!std::isfinite(r.routed_scaling_factor)) {
        return Status::invalid("routed_scaling_factor: expected a finite value, got " +
                               str(r.routed_scaling_factor));
      }
      break;
    }
    default:
      break;
  }
  return Status::ok();
}

Status check_activation(const ActivationSpec& a) {
  if (static_cast<int>(a.kind) > static_cast<int>(Activation::kGeGlu)) {
    return Status::invalid("activation_type: unknown value " + std::to_string(int(a.kind)));
  }
  if (!std::isfinite(a.alpha)) {
    return Status::invalid("activation_alpha: expected a finite value, got " + str(a.alpha));
  }
  if (!std::isfinite(a.beta)) {
    return Status::invalid("activation_beta: expected a finite value, got " + str(a.beta));
  }
  if (std::isnan(a.limit) || a.limit <= 0.0f) {
    return Status::invalid("swiglu_limit: expected a value > 0 (or +inf), got " + str(a.limit));
  }
  if (a.gated() && static_cast<int>(a.glu) > 2) {
    return Status::invalid("swiglu_fusion: expected 0, 1 or 2, got " + std::to_string(int(a.glu)));
  }
  if (a.limit_after_activation && a.kind != Activation::kSwiGlu) {
    return Status::invalid("swiglu_limit_after_activation: requires activation_type swiglu, got " +
                           std::string(activation_name(a.kind)));
  }
  return Status::ok();
}

// Checks one FC's tensors against the shapes its format implies.
Status check_fc_weights(const LayerSpec& s, const FcFormat& f, const FcWeights& w, int64_t n,
                        int64_t k, bool has_bias, const char* fc) {
  const FcTensorShapes shp = fc_tensor_shapes(f, s.weight_experts(), n, k);
  const std::string p(fc);
  QMOE_RETURN_IF_ERROR(expect_tensor(w.weight, p + "_experts_weights", shp.weight_dtype, shp.weight,
                                     shp.weight_rank));
  if (f.info().kind == FormatKind::kFp8) {
    TensorView typed = w.weight;
    typed.dtype = DType::kF8E4M3;
    QMOE_RETURN_IF_ERROR(expect_finite(typed, p + "_experts_weights"));
  }
  if (shp.scale_rank > 0) {
    QMOE_RETURN_IF_ERROR(
        expect_tensor(w.scales, p + "_scales", shp.scale_dtype, shp.scale, shp.scale_rank));
    TensorView typed = w.scales;  // a float8 scale tensor may come typed as raw bytes
    typed.dtype = shp.scale_dtype;
    QMOE_RETURN_IF_ERROR(expect_finite(typed, p + "_scales"));
  } else if (w.scales.present()) {
    return Status::invalid(p + "_scales: not used by format " + f.to_string() +
                           " (it has one global scale per expert); remove it");
  }
  if (shp.zero_point_rank > 0) {
    QMOE_RETURN_IF_ERROR(expect_tensor(w.zero_points, p + "_zero_points", DType::kU8,
                                       shp.zero_point, shp.zero_point_rank));
  } else if (w.zero_points.present()) {
    return Status::invalid(p + "_zero_points: format " + f.to_string() +
                           " has no zero points (set zero_points for an integer format)");
  }
  const int64_t e_dims[1] = {s.weight_experts()};
  if (shp.global_scale) {
    QMOE_RETURN_IF_ERROR(
        expect_tensor(w.global_scale, p + "_global_scale", DType::kF32, e_dims, 1));
    QMOE_RETURN_IF_ERROR(expect_finite(w.global_scale, p + "_global_scale"));
  } else if (w.global_scale.present()) {
    return Status::invalid(p + "_global_scale: not used by format " + f.to_string());
  }
  if (has_bias) {
    const int64_t b_dims[2] = {s.weight_experts(), n};
    if (!w.bias.present() || !is_activation_dtype(w.bias.dtype)) {
      return Status::invalid(p + "_experts_bias: expected f32, f16 or bf16 of shape " +
                             shape_string(b_dims, 2) +
                             (w.bias.present() ? std::string(", got ") + dtype_name(w.bias.dtype)
                                               : std::string(", got nothing")));
    }
    QMOE_RETURN_IF_ERROR(expect_tensor(w.bias, p + "_experts_bias", w.bias.dtype, b_dims, 2));
    QMOE_RETURN_IF_ERROR(expect_finite(w.bias, p + "_experts_bias"));
  } else if (w.bias.present()) {
    return Status::invalid(p + "_experts_bias: given, but the layer spec says it has no " + p +
                           " bias");
  }
  return Status::ok();
}

}  // namespace

const char* activation_name(Activation a) { return enum_name(kActivations, int(a)); }
bool parse_activation(const std::string& s, Activation* out) {
  return enum_parse(kActivations, s, out);
}
const char* routing_method_name(RoutingMethod m) { return enum_name(kRoutingMethods, int(m)); }
bool parse_routing_method(const std::string& s, RoutingMethod* out) {
  return enum_parse(kRoutingMethods, s, out);
}
const char* shared_weight_name(SharedWeight w) { return enum_name(kSharedWeights, int(w)); }
bool parse_shared_weight(const std::string& s, SharedWeight* out) {
  return enum_parse(kSharedWeights, s, out);
}

Status check_spec(const LayerSpec& s) {
  constexpr int64_t kMaxDim = int64_t(1) << 24;
  if (s.hidden < 1 || s.hidden > kMaxDim) {
    return Status::invalid("hidden_size: expected 1..2^24, got " + std::to_string(s.hidden));
  }
  if (s.inter < 1 || s.inter > kMaxDim) {
    return Status::invalid("inter_size: expected 1..2^24, got " + std::to_string(s.inter));
  }
  if (s.num_experts < 1 || s.num_experts > 65536) {
    return Status::invalid("num_experts: expected 1..65536, got " + std::to_string(s.num_experts));
  }
  if (s.local_experts < 0 || s.local_experts > s.num_experts) {
    return Status::invalid(
        "local_experts: expected 0 (all) to num_experts = " + std::to_string(s.num_experts) +
        ", got " + std::to_string(s.local_experts));
  }
  if (s.first_expert < 0 || s.first_expert > s.num_experts - s.weight_experts()) {
    return Status::invalid(
        "first_expert: expected 0 <= first_expert <= num_experts - "
        "local_experts = " +
        std::to_string(s.num_experts - s.weight_experts()) + " (num_experts " +
        std::to_string(s.num_experts) + ", local_experts " + std::to_string(s.weight_experts()) +
        "), got " + std::to_string(s.first_expert));
  }
  if (!is_activation_dtype(s.act_dtype)) {
    return Status::invalid(std::string("act_dtype: expected f32, f16 or bf16, got ") +
                           dtype_name(s.act_dtype));
  }
  QMOE_RETURN_IF_ERROR(check_activation(s.activation));
  QMOE_RETURN_IF_ERROR(check_routing(s));
  QMOE_RETURN_IF_ERROR(check_fc_format(s.fc1, s.fc1_rows(), s.hidden, "fc1"));
  QMOE_RETURN_IF_ERROR(check_fc_format(s.fc2, s.hidden, s.inter, "fc2"));
  if (s.has_fc3()) QMOE_RETURN_IF_ERROR(check_fc_format(s.fc3, s.inter, s.hidden, "fc3"));
  if (s.has_fc3_bias && !s.has_fc3()) {
    return Status::invalid("fc3_experts_bias: only used with swiglu_fusion = 0 (separate FC3)");
  }
  return Status::ok();
}

Status check_layer(const LayerSpec& s, const LayerWeights& w) {
  QMOE_RETURN_IF_ERROR(check_spec(s));
  QMOE_RETURN_IF_ERROR(
      check_fc_weights(s, s.fc1, w.fc1, s.fc1_rows(), s.hidden, s.has_fc1_bias, "fc1"));
  QMOE_RETURN_IF_ERROR(check_fc_weights(s, s.fc2, w.fc2, s.hidden, s.inter, s.has_fc2_bias, "fc2"));
  if (s.has_fc3()) {
    QMOE_RETURN_IF_ERROR(
        check_fc_weights(s, s.fc3, w.fc3, s.inter, s.hidden, s.has_fc3_bias, "fc3"));
  } else if (w.fc3.weight.present()) {
    return Status::invalid(
        "fc3_experts_weights: given, but FC3 is used only by a gated activation with "
        "swiglu_fusion = 0");
  }
  const int64_t routed = s.num_experts - s.routing.num_shared;
  if (s.routing.method == RoutingMethod::kGroupedTopK) {
    const int64_t dims[1] = {routed};
    QMOE_RETURN_IF_ERROR(
        expect_tensor(w.router_bias, "router_correction_bias", DType::kF32, dims, 1));
    QMOE_RETURN_IF_ERROR(expect_finite(w.router_bias, "router_correction_bias"));
  } else if (w.router_bias.present()) {
    return Status::invalid(
        "router_correction_bias: only used by grouped_topk routing, got method " +
        std::string(routing_method_name(s.routing.method)));
  }
  return Status::ok();
}

Status check_inputs(const LayerSpec& s, const RunInputs& in, int64_t* tokens) {
  // Zero tokens are a valid call (input [0, H], [B, 0, H] or [0, S, H]): it returns an empty
  // output. Empty tensors may have null data pointers (TensorView::given()).
  const TensorView& x = in.input;
  if (!x.given()) return Status::invalid("input: missing");
  if (!is_activation_dtype(x.dtype)) {
    return Status::invalid(std::string("input: expected dtype f32, f16 or bf16, got ") +
                           dtype_name(x.dtype));
  }
  if ((x.rank != 2 && x.rank != 3) || x.dims[x.rank - 1] != s.hidden) {
    return Status::invalid("input: expected shape [tokens, " + std::to_string(s.hidden) +
                           "] or [batch, seq, " + std::to_string(s.hidden) + "], got " +
                           x.shape_string());
  }
  if (x.dims[0] < 0 || (x.rank == 3 && x.dims[1] < 0)) {
    return Status::invalid("input: negative dimension in shape " + x.shape_string());
  }
  const int64_t t = x.rank == 2 ? x.dims[0] : x.dims[0] * x.dims[1];
  if (t > (int64_t(1) << 31) / (s.slots() + 1)) {
    return Status::invalid("input: too many tokens (" + std::to_string(t) + ")");
  }
  const int64_t logit_dims[2] = {t, s.num_experts};
  const TensorView& l = in.router_logits;
  if (!l.given()) return Status::invalid("router_probs: missing");
  if (!is_activation_dtype(l.dtype)) {
    return Status::invalid(std::string("router_probs: expected dtype f32, f16 or bf16, got ") +
                           dtype_name(l.dtype));
  }
  QMOE_RETURN_IF_ERROR(expect_tensor(l, "router_probs", l.dtype, logit_dims, 2));
  if (in.router_weights.given()) {
    if (!is_activation_dtype(in.router_weights.dtype)) {
      return Status::invalid(std::string("router_weights: expected f32, f16 or bf16, got ") +
                             dtype_name(in.router_weights.dtype));
    }
    QMOE_RETURN_IF_ERROR(
        expect_tensor(in.router_weights, "router_weights", in.router_weights.dtype, logit_dims, 2));
  }
  *tokens = t;
  return Status::ok();
}

Status check_run(const LayerSpec& s, const RunInputs& in, const MutableTensorView& out,
                 int64_t* tokens) {
  int64_t t = 0;
  QMOE_RETURN_IF_ERROR(check_inputs(s, in, &t));
  const TensorView& x = in.input;
  // An output of zero elements may have a null data pointer (nothing is written to it).
  if (out.data == nullptr && (t > 0 || out.rank < 1)) return Status::invalid("output: missing");
  if (out.rank < 1 || out.dtype != x.dtype || out.numel() != t * s.hidden ||
      out.dims[out.rank - 1] != s.hidden) {
    return Status::invalid(std::string("output: expected dtype ") + dtype_name(x.dtype) +
                           " and shape " + x.shape_string() + ", got " + dtype_name(out.dtype) +
                           " " + shape_string(out.dims, out.rank));
  }
  *tokens = t;
  return Status::ok();
}

double layer_flops(const LayerSpec& s, int64_t tokens) {
  double per_route = 2.0 * s.hidden * s.fc1_rows() + 2.0 * s.inter * s.hidden;
  if (s.has_fc3()) per_route += 2.0 * s.inter * s.hidden;
  return per_route * static_cast<double>(tokens) * s.slots();
}

int64_t expert_bytes(const LayerSpec& s) {
  const size_t act = dtype_size(s.act_dtype);
  int64_t b = fc_bytes_per_expert(s.fc1, s.fc1_rows(), s.hidden) +
              fc_bytes_per_expert(s.fc2, s.hidden, s.inter);
  if (s.has_fc3()) b += fc_bytes_per_expert(s.fc3, s.inter, s.hidden);
  if (s.has_fc1_bias) b += s.fc1_rows() * act;
  if (s.has_fc2_bias) b += s.hidden * act;
  if (s.has_fc3_bias) b += s.inter * act;
  return b;
}

}  // namespace qmoe

#include "describe.h"

#include <cmath>
#include <cstdio>

namespace qmoe::cli {

namespace {

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

const char* glu_name(GluLayout g) {
  switch (g) {
    case GluLayout::kSeparateFc3:
      return "separate fc3";
    case GluLayout::kInterleaved:
      return "interleaved";
    case GluLayout::kConcatenated:
      return "concatenated";
  }
  return "?";
}

}  // namespace

std::string describe_shape(const LayerSpec& s) {
  return "H " + std::to_string(s.hidden) + ", I " + std::to_string(s.inter) + ", E " +
         std::to_string(s.num_experts);
}

std::string describe_routing(const LayerSpec& s) {
  const RoutingSpec& r = s.routing;
  std::string d = "top-" + std::to_string(r.top_k) + " " + routing_method_name(r.method);
  if (r.normalize) d += ", normalized";
  if (r.method == RoutingMethod::kGroupedTopK) {
    d += ", " + std::to_string(r.topk_group) + " of " + std::to_string(r.n_group) +
         " groups, scaling " + num(r.routed_scaling_factor);
  }
  if (r.method == RoutingMethod::kSparseMixer) d += ", eps " + num(r.sparse_mixer_eps);
  if (r.num_shared > 0) {
    d += ", " + std::to_string(r.num_shared) + " shared (weight " +
         (r.shared_weight == SharedWeight::kOne ? "1)" : "sigmoid(logit))");
  }
  if (r.combine == CombineMode::kScaleInput) d += ", weights scale the input";
  if (r.ties == TieBreak::kHigherIndex) d += ", ties to the higher index";
  return d;
}

std::string describe_activation(const LayerSpec& s) {
  const ActivationSpec& a = s.activation;
  std::string d = activation_name(a.kind);
  if (a.gated()) d += std::string(" ") + glu_name(a.glu);
  if (a.kind == Activation::kSwiGlu &&
      (a.alpha != 1.0f || a.beta != 0.0f || !std::isinf(a.limit))) {
    d += " (alpha " + num(a.alpha) + ", beta " + num(a.beta) + ", limit " + num(a.limit) +
         (a.limit_after_activation ? " after activation" : "") + ")";
  }
  if (s.has_fc1_bias || s.has_fc2_bias) d += ", biases";
  return d;
}

std::string describe_formats(const LayerSpec& s) {
  std::string f = "fc1 " + s.fc1.to_string() + ", fc2 " + s.fc2.to_string();
  if (s.has_fc3()) f += ", fc3 " + s.fc3.to_string();
  return f;
}

}  // namespace qmoe::cli

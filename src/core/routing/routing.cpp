// route(): validation of everything routing reads, then route_token() per token and the expert
// maps. The arithmetic lives in route_token.h so that the device reproduces it bit for bit.
#include "qmoe/routing.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "core/numeric.h"
#include "core/routing/route_token.h"
#include "core/routing/routing_checks.h"

namespace qmoe {

namespace {

std::string num_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string i_str(int64_t v) { return std::to_string(v); }

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Elements [offset, offset + n) of an f32/f16/bf16 tensor as fp32.
void load_row(const TensorView& v, int64_t offset, int64_t n, float* out) {
  switch (v.dtype) {
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(v.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = num::f16_to_f32(p[i]);
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(v.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = num::bf16_to_f32(p[i]);
      break;
    }
    default: {
      const float* p = static_cast<const float*>(v.data) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      break;
    }
  }
}

float load_one(const TensorView& v, int64_t i) {
  float f;
  load_row(v, i, 1, &f);
  return f;
}

// The first non-finite value of row t, as an error naming the input, token and expert.
Status check_row_finite(const char* name, const float* row, int64_t n, int64_t t) {
  for (int64_t e = 0; e < n; ++e) {
    if (!std::isfinite(row[e])) {
      return Status::invalid(std::string(name) + ": non-finite value " + num_str(row[e]) +
                             " at token " + i_str(t) + ", expert " + i_str(e));
    }
  }
  return Status::ok();
}

}  // namespace

Status check_routing_spec(const RoutingSpec& r, int64_t e) {
  if (e < 1 || e >= std::numeric_limits<int32_t>::max()) {
    return Status::invalid("num_experts: expected 1 <= num_experts < 2^31 - 1, got " + i_str(e));
  }
  if (r.num_shared < 0 || r.num_shared >= e) {
    return Status::invalid("routing.num_shared: expected 0 <= num_shared < num_experts (" +
                           i_str(e) + "), got " + i_str(r.num_shared));
  }
  const int64_t n = e - r.num_shared;
  if (r.top_k < 1 || r.top_k > n) {
    return Status::invalid("routing.top_k: expected 1 <= top_k <= " + i_str(n) +
                           " (num_experts - num_shared), got " + i_str(r.top_k));
  }
  if (r.ties != TieBreak::kLowerIndex && r.ties != TieBreak::kHigherIndex) {
    return Status::invalid("routing.ties: unknown value " + i_str(static_cast<int>(r.ties)));
  }
  if (r.shared_weight != SharedWeight::kSigmoid && r.shared_weight != SharedWeight::kOne) {
    return Status::invalid("routing.shared_weight: expected sigmoid or one, got " +
                           i_str(static_cast<int>(r.shared_weight)));
  }
  switch (r.method) {
    case RoutingMethod::kSoftmaxTopK:
    case RoutingMethod::kTopKSoftmax:
    case RoutingMethod::kTopKSigmoid:
      return Status::ok();
    case RoutingMethod::kSparseMixer:
      if (r.top_k != 2) {
        return Status::invalid("routing.top_k: sparse_mixer routing requires top_k = 2, got " +
                               i_str(r.top_k));
      }
      if (!std::isfinite(r.sparse_mixer_eps) || r.sparse_mixer_eps < 0.0f) {
        return Status::invalid("routing.sparse_mixer_eps: expected a finite value >= 0, got " +
                               num_str(r.sparse_mixer_eps));
      }
      return Status::ok();
    case RoutingMethod::kGroupedTopK: {
      if (r.n_group < 1 || n % r.n_group != 0) {
        return Status::invalid("routing.n_group: expected a divisor of " + i_str(n) +
                               " (num_experts - num_shared), got " + i_str(r.n_group));
      }
      if (r.topk_group < 1 || r.topk_group > r.n_group) {
        return Status::invalid("routing.topk_group: expected 1 <= topk_group <= " +
                               i_str(r.n_group) + " (n_group), got " + i_str(r.topk_group));
      }
      const int64_t reachable = r.topk_group * (n / r.n_group);
      if (r.top_k > reachable) {
        return Status::invalid("routing.top_k: expected top_k <= " + i_str(reachable) +
                               " (topk_group * experts per group) for grouped_topk, got " +
                               i_str(r.top_k));
      }
      if (!std::isfinite(r.routed_scaling_factor)) {
        return Status::invalid("routing.routed_scaling_factor: expected a finite value, got " +
                               num_str(r.routed_scaling_factor));
      }
      return Status::ok();
    }
  }
  return Status::invalid("routing.method: unknown value " + i_str(static_cast<int>(r.method)));
}

namespace {

Status check_router_bias(const TensorView& b, int64_t n) {
  const std::string want = "f32 [" + i_str(n) + "]";
  if (!b.present()) {
    return Status::invalid(
        "router_correction_bias: required by grouped_topk routing (the correction bias, " + want +
        "), got none");
  }
  if (b.dtype != DType::kF32 || b.rank != 1 || b.dims[0] != n) {
    return Status::invalid("router_correction_bias: expected " + want + ", got " +
                           dtype_name(b.dtype) + " " + b.shape_string());
  }
  const float* p = static_cast<const float*>(b.data);
  for (int64_t e = 0; e < n; ++e) {
    if (!std::isfinite(p[e])) {
      return Status::invalid("router_correction_bias: non-finite value " + num_str(p[e]) +
                             " at expert " + i_str(e));
    }
  }
  return Status::ok();
}

// router_probs (and router_weights) must be f32/f16/bf16 [T, E].
Status check_router_tensor(const TensorView& v, const char* name, int64_t tokens, int64_t e) {
  if (!is_float_dtype(v.dtype)) {
    return Status::invalid(std::string(name) + ": expected dtype f32, f16 or bf16, got " +
                           dtype_name(v.dtype));
  }
  if (v.rank != 2 || v.dims[1] != e || v.dims[0] < 0 || (tokens >= 0 && v.dims[0] != tokens)) {
    const std::string t = tokens >= 0 ? i_str(tokens) : "tokens";
    return Status::invalid(std::string(name) + ": expected shape [" + t + ", " + i_str(e) +
                           "], got " + v.shape_string());
  }
  return Status::ok();
}

Status check_maps(const RouteMapsView& m, int64_t tokens, int slots, int64_t e) {
  if (m.expert_ids == nullptr || m.weights == nullptr || m.expert_counts == nullptr ||
      m.expert_offsets == nullptr || m.permuted_route == nullptr || m.route_position == nullptr ||
      m.scratch == nullptr) {
    return Status::invalid("maps: not carved (null arrays); use carve_route_maps()");
  }
  if (m.tokens < tokens || m.slots != slots || m.experts != e) {
    return Status::invalid("maps: carved for " + i_str(m.tokens) + " tokens, " + i_str(m.slots) +
                           " slots, " + i_str(m.experts) + " experts; expected at least " +
                           i_str(tokens) + " tokens, " + i_str(slots) + " slots, " + i_str(e) +
                           " experts");
  }
  return Status::ok();
}

}  // namespace

Status route(const LayerSpec& spec, const RunInputs& in, const TensorView& router_bias,
             RouteMapsView* maps) {
  if (maps == nullptr) return Status::invalid("maps: null");
  QMOE_RETURN_IF_ERROR(check_routing_spec(spec.routing, spec.num_experts));
  const RoutingSpec& r = spec.routing;
  const int64_t e = spec.num_experts;
  const int64_t n = e - r.num_shared;
  const int slots = spec.slots();

  const TensorView& logits = in.router_logits;
  if (!logits.given()) return Status::invalid("router_probs: missing");
  QMOE_RETURN_IF_ERROR(check_router_tensor(logits, "router_probs", -1, e));
  const int64_t tokens = logits.dims[0];
  if (tokens > std::numeric_limits<int32_t>::max() / slots) {
    return Status::invalid("router_probs: " + i_str(tokens) + " tokens x " + i_str(slots) +
                           " slots exceed the int32 route-id range");
  }
  const TensorView& rw = in.router_weights;
  if (rw.present()) QMOE_RETURN_IF_ERROR(check_router_tensor(rw, "router_weights", tokens, e));
  const bool grouped = r.method == RoutingMethod::kGroupedTopK;
  if (grouped) QMOE_RETURN_IF_ERROR(check_router_bias(router_bias, n));
  QMOE_RETURN_IF_ERROR(check_maps(*maps, tokens, slots, e));

  maps->tokens = tokens;
  float* x = maps->scratch;
  float* work = maps->scratch + e;
  const float* bias = grouped ? static_cast<const float*>(router_bias.data) : nullptr;
  for (int64_t t = 0; t < tokens; ++t) {
    load_row(logits, t * e, e, x);
    QMOE_RETURN_IF_ERROR(check_row_finite("router_probs", x, e, t));
    if (rw.present()) {
      // Checked before route_token() clobbers the scratch it shares with the logits.
      load_row(rw, t * e, e, work);
      QMOE_RETURN_IF_ERROR(check_row_finite("router_weights", work, e, t));
    }
    int32_t* ids = maps->expert_ids + t * slots;
    float* w = maps->weights + t * slots;
    routing::route_token(r, static_cast<int>(e), x, bias, work, ids, w);
    if (rw.present()) {
      for (int j = 0; j < r.top_k; ++j) w[j] = load_one(rw, t * e + ids[j]);
      routing::finish_slot_weights(r, /*gathered=*/true, w);
    }
  }
  build_expert_maps(maps);
  return Status::ok();
}

}  // namespace qmoe

// launch_routing(): host-side validation of everything the kernels rely on (the same rules as
// route() for the spec, plus the device limits and the pointers), then the fused or the general
// path. Data values (non-finite logits) can only be checked on the device: see
// device_routing.h. Nothing here synchronizes, allocates or touches memory, so a failed check
// launches nothing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/routing/routing_checks.h"
#include "cuda/common/cuda_check.h"
#include "cuda/routing/device_routing.h"
#include "cuda/routing/routing_internal.cuh"

namespace qmoe::cuda {
namespace {

std::string i_str(int64_t v) { return std::to_string(v); }

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

Status check_maps(const RouteMapsView& m, int64_t tokens, int slots, int64_t e) {
  if (m.expert_ids == nullptr || m.weights == nullptr || m.expert_counts == nullptr ||
      m.expert_offsets == nullptr || m.permuted_route == nullptr || m.route_position == nullptr) {
    return Status::invalid(
        "args.maps: null arrays; expected device arrays from carve_route_maps() on device memory");
  }
  if (m.tokens < tokens || m.slots != slots || m.experts != e) {
    return Status::invalid("args.maps: carved for " + i_str(m.tokens) + " tokens, " +
                           i_str(m.slots) + " slots, " + i_str(m.experts) +
                           " experts; expected at least " + i_str(tokens) + " tokens, " +
                           i_str(slots) + " slots, " + i_str(e) + " experts");
  }
  return Status::ok();
}

Status check_args(const DeviceRoutingArgs& a) {
  const RoutingSpec& r = a.routing;
  if (a.num_experts < 1 || a.num_experts > kGeneralMaxExperts) {
    return Status::invalid(
        "args.num_experts: expected 1 <= num_experts <= " + i_str(kGeneralMaxExperts) +
        " on the device, got " + i_str(a.num_experts));
  }
  QMOE_RETURN_IF_ERROR(check_routing_spec(r, a.num_experts));
  const int slots = r.top_k + r.num_shared;
  QMOE_RETURN_IF_ERROR(routing_detail::check_routing_sizes(a.tokens, slots, a.num_experts));
  if (a.tokens > 0 && a.logits == nullptr) {
    return Status::invalid("args.logits: null; expected a device [" + i_str(a.tokens) + ", " +
                           i_str(a.num_experts) + "] array");
  }
  if (!is_float_dtype(a.logits_dtype)) {
    return Status::invalid(std::string("args.logits_dtype: expected f32, f16 or bf16, got ") +
                           dtype_name(a.logits_dtype));
  }
  if (a.router_weights != nullptr && !is_float_dtype(a.rw_dtype)) {
    return Status::invalid(std::string("args.rw_dtype: expected f32, f16 or bf16, got ") +
                           dtype_name(a.rw_dtype));
  }
  if (r.method == RoutingMethod::kGroupedTopK && a.router_bias == nullptr) {
    return Status::invalid("args.router_bias: required by grouped_topk routing (device f32 [" +
                           i_str(a.num_experts - r.num_shared) + "]), got null");
  }
  if (a.plan_touched != nullptr &&
      (a.plan_n_touched == nullptr || a.plan_tile_start == nullptr || a.plan_tile_m < 1)) {
    return Status::invalid(
        "args.plan_*: with plan_touched set, plan_n_touched and plan_tile_start must be device "
        "arrays and plan_tile_m at least 1, got tile_m " +
        i_str(a.plan_tile_m));
  }
  const int plan_experts = a.plan_experts > 0 ? a.plan_experts : a.num_experts;
  if (a.plan_first < 0 || a.plan_experts < 0 || a.plan_first + plan_experts > a.num_experts) {
    return Status::invalid("args.plan_first/plan_experts: expected a range inside [0, " +
                           i_str(a.num_experts) + "), got first " + i_str(a.plan_first) +
                           ", count " + i_str(a.plan_experts));
  }
  if (a.error == nullptr) {
    return Status::invalid("args.error: null; expected a device int32[2] error word");
  }
  if (a.plan_setup_count < 0 || a.plan_setup_count > DeviceRoutingArgs::kMaxPlanSetups ||
      (a.plan_setup_count > 0 && a.plan_touched == nullptr)) {
    return Status::invalid(
        "args.plan_setup_count: expected 0.." + i_str(DeviceRoutingArgs::kMaxPlanSetups) +
        " and setups only with the plan (plan_touched), got " + i_str(a.plan_setup_count));
  }
  for (int i = 0; i < a.plan_setup_count; ++i) {
    const GroupSetup& g = a.plan_setups[i];
    if (!g.on() || g.max_groups < 1 || g.max_groups > plan_experts) {
      return Status::invalid("args.plan_setups[" + i_str(i) +
                             "]: expected group arrays and 1 <= max_groups <= the plan's " +
                             i_str(plan_experts) + " experts, got " + i_str(g.max_groups));
    }
  }
  const DeviceRoutingArgs::Gather& g = a.gather;
  if (g.input != nullptr &&
      (g.out == nullptr || g.error == nullptr || g.hidden < 8 || g.hidden % 8 != 0 ||
       g.ld < g.hidden || g.ld % 8 != 0 || reinterpret_cast<uintptr_t>(g.input) % 16 != 0 ||
       reinterpret_cast<uintptr_t>(g.out) % 16 != 0)) {
    return Status::invalid(
        "args.gather: expected out and error, hidden and ld >= hidden multiples of 8, input and "
        "out 16-byte aligned, got hidden " +
        i_str(g.hidden) + ", ld " + i_str(g.ld));
  }
  return check_maps(a.maps, a.tokens, slots, a.num_experts);
}

}  // namespace

namespace routing_detail {

Status check_routing_sizes(int64_t tokens, int slots, int64_t experts) {
  if (experts < 1 || experts > kGeneralMaxExperts) {
    return Status::invalid("experts: expected 1 <= experts <= " + i_str(kGeneralMaxExperts) +
                           " on the device, got " + i_str(experts));
  }
  if (slots < 1) return Status::invalid("slots: expected >= 1, got " + i_str(slots));
  if (tokens < 0 || tokens > std::numeric_limits<int32_t>::max() / slots) {
    return Status::invalid("tokens: expected 0 <= tokens and tokens * slots (" + i_str(slots) +
                           ") < 2^31, got " + i_str(tokens));
  }
  return Status::ok();
}

Status allow_dynamic_smem(const void* kernel, size_t smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> granted;  // (kernel, device) -> bytes
  int device = 0;
  QMOE_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  size_t& g = granted[{kernel, device}];
  if (g >= smem) return Status::ok();
  QMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  g = smem;
  return Status::ok();
}

}  // namespace routing_detail

bool fused_routing_applies(int64_t tokens, int slots, int64_t experts) {
  return tokens >= 0 && tokens <= kFusedMaxTokens && slots >= 1 && slots <= kFusedMaxSlots &&
         experts >= 1 && experts <= kFusedMaxExperts;
}

bool blocked_routing_applies(int64_t tokens, int slots, int64_t experts) {
  return tokens >= 1 && tokens <= kBlockedMaxTokens && slots >= 1 && slots <= kFusedMaxSlots &&
         experts >= 1 && experts <= kFusedMaxExperts;
}

bool routing_builds_plan(int64_t tokens, int slots, int64_t experts) {
  return fused_routing_applies(tokens, slots, experts) ||
         blocked_routing_applies(tokens, slots, experts);
}

bool routing_writes_setups(int64_t tokens, int slots, int64_t experts) {
  return !fused_routing_applies(tokens, slots, experts) &&
         blocked_routing_applies(tokens, slots, experts);
}

Status general_routing_temp_bytes(int64_t tokens, int slots, int64_t experts, size_t* bytes) {
  if (bytes == nullptr) return Status::invalid("bytes: null");
  *bytes = 0;
  QMOE_RETURN_IF_ERROR(routing_detail::check_routing_sizes(tokens, slots, experts));
  if (fused_routing_applies(tokens, slots, experts)) return Status::ok();
  size_t general = 0;
  QMOE_RETURN_IF_ERROR(general_path_temp_bytes(tokens, slots, experts, &general));
  const int64_t blocked_tokens = std::min<int64_t>(tokens, kBlockedMaxTokens);
  const size_t blocked = blocked_routing_applies(blocked_tokens, slots, experts)
                             ? routing_detail::blocked_path_temp_bytes(blocked_tokens, experts)
                             : 0;
  *bytes = std::max(general, blocked);
  return Status::ok();
}

Status launch_routing_path(const DeviceRoutingArgs& args, RoutingPath path, void* temp,
                           size_t temp_bytes, cudaStream_t stream) {
  QMOE_RETURN_IF_ERROR(check_args(args));
  const int slots = args.routing.top_k + args.routing.num_shared;
  const bool fused = fused_routing_applies(args.tokens, slots, args.num_experts);
  if (path == RoutingPath::kFused && !fused) {
    return Status::invalid(
        "path: the fused path needs tokens <= " + i_str(kFusedMaxTokens) +
        ", slots <= " + i_str(kFusedMaxSlots) + " and experts <= " + i_str(kFusedMaxExperts) +
        "; got " + i_str(args.tokens) + ", " + i_str(slots) + ", " + i_str(args.num_experts));
  }
  if (path == RoutingPath::kFused || (path == RoutingPath::kAuto && fused)) {
    return routing_detail::launch_fused_routing(args, stream);
  }
  const bool blocked = blocked_routing_applies(args.tokens, slots, args.num_experts);
  if (path == RoutingPath::kBlocked && !blocked) {
    return Status::invalid(
        "path: the blocked path needs 1 <= tokens <= " + i_str(kBlockedMaxTokens) +
        ", slots <= " + i_str(kFusedMaxSlots) + " and experts <= " + i_str(kFusedMaxExperts) +
        "; got " + i_str(args.tokens) + ", " + i_str(slots) + ", " + i_str(args.num_experts));
  }
  if (temp != nullptr && reinterpret_cast<uintptr_t>(temp) % kRoutingTempAlign != 0) {
    return Status::invalid("temp: expected a " + i_str(kRoutingTempAlign) +
                           "-byte aligned pointer");
  }
  if (path == RoutingPath::kBlocked || (path == RoutingPath::kAuto && blocked)) {
    return routing_detail::launch_blocked_routing(args, temp, temp_bytes, stream);
  }
  return routing_detail::launch_general_routing(args, temp, temp_bytes, stream);
}

Status launch_routing(const DeviceRoutingArgs& args, void* temp, size_t temp_bytes,
                      cudaStream_t stream) {
  return launch_routing_path(args, RoutingPath::kAuto, temp, temp_bytes, stream);
}

}  // namespace qmoe::cuda

// The run pipeline (cuda_layer.h): checks, routing and the plan, the decode or the generic path,
// the combine (finalize); the deferred error record's take.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/decode/decode_gemv.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/gemm/cutlass_grouped.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/cuda_layer.h"
#include "cuda/layer/stages.h"

namespace qmoe::cuda {
namespace {

// Whether p is memory the device can read (device, managed or mapped host memory).
Status check_device_pointer(const void* p, const char* name, size_t align) {
  if (p == nullptr)
    return Status::invalid(std::string(name) + ": expected a device pointer, got null");
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    return Status::invalid(std::string(name) + ": expected a " + std::to_string(align) +
                           "-byte aligned pointer");
  }
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return Status::invalid(std::string(name) + ": not a pointer the CUDA runtime knows");
  }
  if (attr.type == cudaMemoryTypeUnregistered ||
      (attr.type == cudaMemoryTypeHost && attr.devicePointer == nullptr)) {
    return Status::invalid(std::string(name) +
                           ": expected device memory (the CUDA backend runs on device tensors), "
                           "got host memory");
  }
  return Status::ok();
}

// The decode kernel's activation rows per pass for a call of t tokens: DecodeOptions::rows, or
// decode_rows_per_pass() where that is -1.
int decode_rows(int64_t t, const LayerSpec& s, const DecodeOptions& o) {
  return o.rows >= 0
             ? o.rows
             : decode_rows_per_pass(t, s.routing.top_k, s.routing.num_shared, s.num_experts);
}

// Moves the layer's error record (error[0..1]: bits, first token) to error[2..3] and clears it,
// each word by one atomic exchange, so that an error a kernel on another stream records meanwhile
// is either taken here or left for the next take, never lost. (Its token word can then belong to
// the other take: the bits are exact, the first token is a hint.)
__global__ void take_error_kernel(int32_t* error) {
  error[2] = atomicExch(&error[0], 0);
  error[3] = atomicExch(&error[1], INT32_MAX);
}

}  // namespace

Status CudaLayer::run_fused(const RunInputs& in, const MutableTensorView& out, const Layout& l,
                            char* ws, int64_t tokens, cudaStream_t stream, RunProfile* profile) {
  // The layer's part comes from plan_fused(); a call adds its tokens and pointers.
  FusedDecodeArgs a = fused_args_;
  a.tokens = static_cast<int>(tokens);
  a.logits = in.router_logits.data;
  a.logits_dtype = in.router_logits.dtype;
  a.router_weights = in.router_weights.data;
  a.rw_dtype = in.router_weights.present() ? in.router_weights.dtype : DType::kF32;
  a.x = in.input.data;
  a.out = out.data;
  a.out_dtype = out.dtype;
  a.partial = reinterpret_cast<float*>(ws + l.fused);
  const FusedLaunch& plan = fused_plans_[static_cast<size_t>(tokens)];
  if (profile == nullptr) return launch_fused_decode(a, plan, stream);
  const int ctas = plan.grid;
  const size_t bytes = sizeof(unsigned long long) * kFusedStamps * static_cast<size_t>(ctas);
  if (fused_stamps_.bytes() < bytes) QMOE_RETURN_IF_ERROR(fused_stamps_.allocate(bytes));
  a.stamps = fused_stamps_.as<unsigned long long>();
  QMOE_RETURN_IF_ERROR(launch_fused_decode(a, plan, stream));
  std::vector<unsigned long long> t(static_cast<size_t>(ctas) * kFusedStamps);
  QMOE_CUDA_TRY(
      cudaMemcpyAsync(t.data(), a.stamps, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost, stream));
  QMOE_CUDA_TRY(cudaStreamSynchronize(stream));
  unsigned long long t0 = ~0ull, routed = 0, done = 0, end = 0, busy = 0, fc2 = 0;
  for (int c = 0; c < ctas; ++c) {
    const unsigned long long* s = t.data() + static_cast<size_t>(c) * kFusedStamps;
    t0 = std::min(t0, s[kStampStart]);
    routed = std::max(routed, s[kStampRouted]);
    done = std::max(done, s[kStampItemsDone]);
    end = std::max(end, s[kStampEnd]);
    if (s[kStampFc1Ns] + s[kStampFc2Ns] >= busy + fc2) {  // the busiest CTA's items
      busy = s[kStampFc1Ns];
      fc2 = s[kStampFc2Ns];
    }
  }
  *profile = RunProfile{};
  profile->route_us = 1e-3 * static_cast<double>(routed - t0);
  profile->fc1_us = 1e-3 * static_cast<double>(busy);
  profile->fc2_us = 1e-3 * static_cast<double>(fc2);
  profile->combine_us = 1e-3 * static_cast<double>(end - done);
  profile->combine_fused = true;
  return Status::ok();
}

// Routing and the plan done: FC1 (+activation) and FC2 by the decode kernels.
Status CudaLayer::run_decode(const RunInputs& in, const Layout& l, char* ws,
                             const RouteMapsView& maps, const CombineTerms* combine,
                             cudaStream_t stream, RunProfile* profile) {
  const int tokens = static_cast<int>(maps.tokens);
  DecodeFcArgs d;
  d.touched = reinterpret_cast<const int32_t*>(ws + l.touched);
  d.n_touched = reinterpret_cast<const int32_t*>(ws + l.n_touched);
  d.offsets = maps.expert_offsets;
  d.max_groups =
      static_cast<int>(std::min<int64_t>(spec_.weight_experts(), maps.tokens * spec_.slots()));
  d.permuted_route = maps.permuted_route;
  d.weights = maps.weights;
  d.slots = spec_.slots();
  d.dtype = cdt_;
  d.pdl = pdl_;
  const int tiles_per_block = decode_options_.tiles_per_block;
  d.max_rows = decode_rows(tokens, spec_, decode_options_);
  d.ring = decode_options_.ring;
  d.prefetch = decode_options_.prefetch;
  d.min_blocks = decode_options_.min_blocks;

  d.shape = pack1_;
  d.packed = packed1_;
  d.scales = tiled_scales1_;
  d.scale_dtype = spec_.fc1.scale_dtype;
  d.zero_points = tiled_zp1_;
  d.global = fc1_.global_scale;
  d.x = in.input.data;
  d.ldx = spec_.hidden;
  d.by_token = true;
  d.fc1 = true;
  d.act = spec_.activation;
  d.scale_input = spec_.routing.combine == CombineMode::kScaleInput;
  d.bias = fc1_.bias;
  d.bias_dtype = fc1_.bias_dtype;
  d.out = ws + l.xa;
  d.ldo = ip_;
  d.error = error_.as<int32_t>();
  // FC1's blocks count themselves done per expert; FC2's blocks wait for their expert's count
  // (zeroed by the plan) rather than for FC1's whole grid. Not with the combine (a token or two),
  // where it lost (qwen3-30b-a3b one token 26.0 -> 27.1 us, gpt-oss-20b 44.9 -> 46.6 on an H100,
  // bench/results/2026-12-06-h100-ready.md), and still did with the lighter release (26.1 ->
  // 26.9, bench/results/2026-12-06-h100-finalize-counters-and-tests-race.md): not the release's
  // cost; likely FC2's clusters, which become resident only as FC1's blocks leave.
  d.ready = combine == nullptr ? reinterpret_cast<int32_t*>(ws + l.ready) : nullptr;
  int fc1_blocks = 0;
  QMOE_RETURN_IF_ERROR(launch_decode_fc(d, tokens, tiles_per_block, stream, &fc1_blocks));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[2], stream));
  d.ready_target = d.ready != nullptr ? fc1_blocks : 0;

  d.shape = pack2_;
  d.packed = packed2_;
  d.scales = tiled_scales2_;
  d.scale_dtype = spec_.fc2.scale_dtype;
  d.zero_points = tiled_zp2_;
  d.global = fc2_.global_scale;
  d.x = ws + l.xa;
  d.ldx = ip_;
  d.by_token = false;
  d.fc1 = false;
  d.scale_input = false;
  d.bias = nullptr;
  d.out = ws + l.hy;
  d.ldo = hp_;
  d.error = nullptr;
  if (combine != nullptr) {  // the finalize kernel's sums, in FC2's blocks
    d.combine = true;
    d.terms = *combine;
  }
  QMOE_RETURN_IF_ERROR(launch_decode_fc(d, tokens, tiles_per_block, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[3], stream));
  return Status::ok();
}

// Waits for the device (every stream: calls may have run on any), then takes the record with
// atomic exchanges, so that calls other threads enqueue meanwhile lose no error.
Status CudaLayer::take_deferred_error() {
  std::lock_guard<std::mutex> lock(take_mu_);
  DeviceGuard guard(device_);
  if (!guard.ok()) return Status::internal("cudaSetDevice(" + std::to_string(device_) + ") failed");
  QMOE_CUDA_TRY(cudaDeviceSynchronize());
  int32_t* record = error_.as<int32_t>();
  take_error_kernel<<<1, 1, 0, take_stream_>>>(record);
  QMOE_CUDA_TRY(cudaGetLastError());
  int32_t word[2];
  QMOE_CUDA_TRY(
      cudaMemcpyAsync(word, record + 2, sizeof(word), cudaMemcpyDeviceToHost, take_stream_));
  QMOE_CUDA_TRY(cudaStreamSynchronize(take_stream_));
  if (word[0] == 0) return Status::ok();
  std::string what;
  if (word[0] & kErrorLogits) what += "router_probs";
  if (word[0] & kErrorRouterWeights) what += what.empty() ? "router_weights" : ", router_weights";
  if (word[0] & kErrorInput) what += what.empty() ? "input" : ", input";
  const std::string at = word[1] == INT32_MAX ? "" : ", first at token " + std::to_string(word[1]);
  return Status::invalid(what + ": non-finite value(s)" + at + "; those tokens' outputs are NaN");
}

// Few rows per expert: the narrow or middle tile, so the wgmma is not mostly padding
// (cutlass_mixed_narrow.cuh, cutlass_mixed_mid.cuh); more: the 128-row one. The host knows the
// average, routes / E (dispatch.h).
int CudaLayer::mixed_tile_of(const MixedFc& mx, int64_t routes, int tile) const {
  if (tile == 0) {
    tile = mixed_tile_ != 0 ? mixed_tile_ : mixed_tile_for(routes, spec_.num_experts, mx.mid_routes);
  }
  return mixed_has_tile(mx.kind, cdt_, tile) ? tile : 128;
}

std::vector<int> CudaLayer::layer_tiles() const {
  std::vector<int> tiles;
  if (act_fp8_) return tiles;
  for (int t : kMixedTiles) {
    for (const MixedFc* m : {&mixed1_, &mixed2_, &mixed3_}) {
      if (m->on() && mixed_has_tile(m->kind, cdt_, t)) {
        tiles.push_back(t);
        break;
      }
    }
  }
  if (tiles.size() < 2) tiles.clear();
  return tiles;
}

MixedGemmArgs CudaLayer::mixed_args(const FcCall& c, const Layout& l, char* ws,
                                    const RouteMapsView& maps) const {
  const MixedFc& mx = *c.mx;
  MixedGemmArgs m;
  m.codes_kind = mx.kind;
  m.dtype = cdt_;
  m.a = c.a;
  m.lda = c.lda;
  m.c = c.c;
  m.ldc = c.ldc;
  m.n = c.fc->n;
  m.k = c.fc->k;
  m.codes = mx.codes;
  m.scales = mx.scales;
  m.zeros = mx.zeros;
  m.chunk = mx.chunk;
  m.sched = schedule(l, ws, maps);
  m.max_groups = max_groups(maps);
  m.tile_n = c.tile;
  m.pdl = c.pdl;
  if (c.act_out != nullptr) {
    m.act_epilogue = true;
    m.act = spec_.activation;
    m.act_out = c.act_out;
    m.ld_act = ip_;
    m.c = nullptr;
    m.ldc = 0;
  }
  return m;
}

CudaLayer::GenericCalls CudaLayer::generic_calls(const Layout& l, char* ws, int64_t routes,
                                                 int tile, bool pdl) const {
  GenericCalls g;
  g.pdl = pdl;
  void* xa = ws + l.xa;
  void* h = ws + l.hy;
  // Each FC's tile (0 without a mixed-input copy): the choice's, or the layer's.
  auto fc = [&](const DeviceFc& f, const MixedFc& mx, const void* a, int64_t lda, void* c,
                int64_t ldc, int64_t ld_b, size_t region, size_t end) {
    FcCall call;
    call.fc = &f;
    call.mx = &mx;
    call.a = a;
    call.lda = lda;
    call.c = c;
    call.ldc = ldc;
    call.ld_b = ld_b;
    call.tile = mx.on() ? mixed_tile_of(mx, routes, tile) : 0;
    call.region = region;
    call.region_bytes = end - region;
    call.pdl = pdl;
    return call;
  };
  g.fc1 = fc(fc1_, mixed1_, xa, hp_, h, n1p_, hp_, l.mixed, l.mixed2);
  // FC1's banded copy on a tile with the epilogue form: FC1's GEMM activates into ya, FC2 reads
  // it there; else the activation kernel writes FC2's input over the gathered input (dead once
  // FC1 and FC3 have run).
  g.act_epilogue = act_epilogue_ && mixed_has_act_epilogue(mixed1_.kind, cdt_, g.fc1.tile);
  if (g.act_epilogue) {
    g.fc1.act_out = ws + l.ya;
    g.fc1.c = nullptr;
    g.fc1.ldc = 0;
  }
  if (spec_.has_fc3()) g.fc3 = fc(fc3_, mixed3_, xa, hp_, ws + l.h3, ip_, hp_, l.mixed, l.mixed2);
  const void* y = g.act_epilogue ? static_cast<const void*>(ws + l.ya) : xa;
  g.fc2 = fc(fc2_, mixed2_, y, ip_, h, hp_, ip_, l.mixed2, l.fused);
  return g;
}

// One FC: the mixed-input GEMM on the FC's prepared codes in one launch, or, over every wave,
// dequantize the wave's experts, then the grouped GEMM into c.
Status CudaLayer::run_fc(const FcCall& call, const Layout& l, char* ws, const RouteMapsView& maps,
                         cudaStream_t stream, bool setup_written) {
  const DeviceFc& fc = *call.fc;
  const MixedFc& mx = *call.mx;
  const GroupSchedule sched = schedule(l, ws, maps);
  const int64_t routes = maps.tokens * spec_.slots();
  if (call.act_out != nullptr && !mx.on()) {
    return Status::internal("run_fc: the activation epilogue without a mixed-input copy");
  }
  if (mx.on()) {
    // No fallback: the layout may hold no scratch. The strides and workspace pointers always
    // qualify (multiples of 32 elements, 256-byte aligned); launch_mixed_grouped_gemm checks.
    MixedGemmArgs m = mixed_args(call, l, ws, maps);
    m.setup_written = setup_written;
    return launch_mixed_grouped_gemm(m, sm_count_, ws + call.region, call.region_bytes, stream);
  }
  const void* a = call.a;
  const int64_t lda = call.lda, ldc = call.ldc, ld_b = call.ld_b;
  void* c = call.c;
  const int s = static_cast<int>(l.slots_in_scratch);
  for (int64_t wave = 0; wave < l.waves; ++wave) {
    DequantArgs d;
    d.fc = fc;
    d.out_dtype = cdt_;
    d.out = ws + l.scratch;
    d.ld = ld_b;
    d.slot_stride = fc.n * ld_b;
    d.touched = sched.touched;
    d.n_touched = sched.n_touched;
    d.first_group = static_cast<int>(wave * s);
    d.max_groups = s;
    QMOE_RETURN_IF_ERROR(launch_dequant(d, stream));

    GroupedGemmArgs g;
    g.dtype = cdt_;
    g.a = a;
    g.lda = lda;
    g.b = ws + l.scratch;
    g.ldb = ld_b;
    g.b_stride = fc.n * ld_b;
    g.c = static_cast<float*>(c);  // the dequantize path's GEMMs write fp32 rows
    g.ldc = ldc;
    g.n = fc.n;
    g.k = ld_b;
    g.sched = sched;
    g.first_group = d.first_group;
    g.max_groups = s;
    g.max_tiles = std::min<int64_t>(routes, (routes + kGemmTileM - 1) / kGemmTileM + s);
    g.pdl = call.pdl;  // the CUTLASS GEMM's setup kernel and GEMM (the other GEMMs ignore it)
    if (cutlass_ && cutlass_gemm_can_implement(g)) {
      const size_t bytes = l.mixed - l.cutlass;  // the region runs to the mixed GEMM's
      QMOE_RETURN_IF_ERROR(
          launch_cutlass_grouped_gemm(g, sm_count_, ws + l.cutlass, bytes, stream));
    } else {
      QMOE_RETURN_IF_ERROR(launch_grouped_gemm(g, stream));
    }
  }
  return Status::ok();
}

Status CudaLayer::run(const RunInputs& in, const MutableTensorView& out, void* workspace,
                      size_t workspace_bytes, void* stream_ptr, RunProfile* profile) {
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(spec_, in, out, &tokens));
  // Zero tokens: an empty output. No CUDA call at all (a captured graph gets no node); the
  // workspace, the stream and the (possibly null) data pointers are not looked at.
  if (tokens == 0) {
    if (profile) *profile = RunProfile{};
    return Status::ok();
  }
  // The profile's events are the layer's: calls with a profile take turns.
  std::unique_lock<std::mutex> profile_lock(profile_mu_, std::defer_lock);
  if (profile) profile_lock.lock();
  DeviceGuard guard(device_);
  if (!guard.ok()) return Status::internal("cudaSetDevice(" + std::to_string(device_) + ") failed");
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  Layout l;
  QMOE_RETURN_IF_ERROR(layout(tokens, &l));
  if (workspace == nullptr || workspace_bytes < l.total) {
    return Status::invalid("workspace: expected at least " + std::to_string(l.total) +
                           " bytes (workspace_size(" + std::to_string(tokens) + ")), got " +
                           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
  }
  QMOE_RETURN_IF_ERROR(check_device_pointer(workspace, "workspace", kAlign));
  const size_t esz = dtype_size(spec_.act_dtype);
  QMOE_RETURN_IF_ERROR(check_device_pointer(in.input.data, "input", esz));
  QMOE_RETURN_IF_ERROR(check_device_pointer(in.router_logits.data, "router_probs",
                                            dtype_size(in.router_logits.dtype)));
  if (in.router_weights.present()) {
    QMOE_RETURN_IF_ERROR(check_device_pointer(in.router_weights.data, "router_weights",
                                              dtype_size(in.router_weights.dtype)));
  }
  QMOE_RETURN_IF_ERROR(check_device_pointer(out.data, "output", esz));
  if (profile) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    QMOE_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) {
      return Status::invalid(
          "profile: per-stage times need a synchronizing run; pass nullptr "
          "while capturing a graph");
    }
  }
  const DispatchChoice choice = dispatch_.choose(tokens);

  char* ws = static_cast<char*>(workspace);
  const int slots = spec_.slots();
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[0], stream));
  if (choice.path == CallPath::kFused && reinterpret_cast<uintptr_t>(in.input.data) % 16 == 0) {
    return run_fused(in, out, l, ws, tokens, stream, profile);
  }

  // Routing and the plan.
  RouteMapsView maps = carve_route_maps(ws + l.maps, tokens, slots, spec_.num_experts);
  maps.tokens = tokens;
  DeviceRoutingArgs ra;
  ra.routing = spec_.routing;
  ra.num_experts = static_cast<int>(spec_.num_experts);
  ra.tokens = tokens;
  ra.logits = in.router_logits.data;
  ra.logits_dtype = in.router_logits.dtype;
  ra.router_weights = in.router_weights.data;
  ra.rw_dtype = in.router_weights.present() ? in.router_weights.dtype : DType::kF32;
  ra.router_bias = router_bias_;
  ra.maps = maps;
  ra.error = error_.as<int32_t>();
  // Local experts: routing runs over all E, the plan over the held experts only (local indices).
  const int64_t first = spec_.first_expert, held = spec_.weight_experts();
  ra.plan_first = static_cast<int>(first);
  ra.plan_experts = static_cast<int>(held);
  // The fused and blocked routing paths build the plan too; the general one leaves it to
  // launch_plan.
  const bool routing_plans = routing_builds_plan(tokens, slots, spec_.num_experts);
  int32_t* touched = reinterpret_cast<int32_t*>(ws + l.touched);
  int32_t* n_touched = reinterpret_cast<int32_t*>(ws + l.n_touched);
  int32_t* tile_start = reinterpret_cast<int32_t*>(ws + l.tile_start);
  int32_t* ready = reinterpret_cast<int32_t*>(ws + l.ready);
  if (routing_plans) {
    ra.plan_touched = touched;
    ra.plan_n_touched = n_touched;
    ra.plan_tile_start = tile_start;
    ra.plan_tile_m = kGemmTileM;
    ra.plan_ready = ready;
  }
  // What the FCs see: the held experts' counts and offsets, by local index. The held range's
  // routes sit contiguously at positions [offsets[first], offsets[first + L]) (the maps are
  // sorted by expert), so the decode kernels, the dequantize pass and the grouped GEMMs run an
  // L-expert layer unchanged; positions of other shards' routes are never written.
  RouteMapsView local = maps;
  local.experts = held;
  local.expert_counts += first;
  local.expert_offsets += first;

  const bool aligned = reinterpret_cast<uintptr_t>(in.input.data) % 16 == 0;
  const bool decode = choice.path == CallPath::kDecode && aligned;
  // On the generic path with FC1 and FC2 on the mixed-input GEMM and the blocked routing, the
  // routing's kernels also write both GEMMs' group arrays (as it plans the experts) and gather
  // the input (as it places the routes): three kernels fewer per call (the gather, two setups).
  const bool planned = !decode && !act_fp8_ && mixed1_.on() && mixed2_.on() && !spec_.has_fc3() &&
                       aligned && spec_.hidden % 8 == 0 &&
                       routing_writes_setups(tokens, slots, spec_.num_experts);
  // Such a call launches plainly: each GEMM then follows a kernel of the call's main work (the
  // place-and-gather kernel, FC1) directly, and programmatic dependent launch, which starts the
  // next grid early beside it, made these calls 1.6-10% slower at 128-2048 tokens
  // (docs/cuda-backend.md).
  const bool pdl = pdl_ && !planned;
  ra.pdl = pdl;
  GenericCalls calls;
  if (!decode) calls = generic_calls(l, ws, tokens * slots, choice.tile, pdl);
  if (planned) {
    QMOE_RETURN_IF_ERROR(mixed_gemm_setup(mixed_args(calls.fc1, l, ws, local), sm_count_,
                                          ws + calls.fc1.region, calls.fc1.region_bytes,
                                          &ra.plan_setups[0]));
    QMOE_RETURN_IF_ERROR(mixed_gemm_setup(mixed_args(calls.fc2, l, ws, local), sm_count_,
                                          ws + calls.fc2.region, calls.fc2.region_bytes,
                                          &ra.plan_setups[1]));
    ra.plan_setup_count = 2;
    ra.gather.input = in.input.data;
    ra.gather.bf16 = spec_.act_dtype == DType::kBF16;
    ra.gather.hidden = spec_.hidden;
    ra.gather.out = ws + l.xa;
    ra.gather.ld = hp_;
    ra.gather.error = error_.as<int32_t>();
    ra.gather.error_bit = kErrorInput;
  }
  QMOE_RETURN_IF_ERROR(launch_routing(ra, ws + l.route_temp, l.route_temp_bytes, stream));
  if (!routing_plans) {
    QMOE_RETURN_IF_ERROR(launch_plan(maps.expert_counts + first, held, touched, n_touched,
                                     tile_start, ready, stream, pdl));
  }
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[1], stream));

  const bool scale_input = spec_.routing.combine == CombineMode::kScaleInput;
  FinalizeArgs fa;
  fa.y = ws + l.hy;
  fa.ldy = hp_;
  // FC2's rows: f32 from the decode kernels and the dequantize path, bf16 from the FP8 GEMM
  // (cutlass_fp8.h), mixed_out_dtype from the mixed-input GEMM.
  fa.y_dtype = decode     ? DType::kF32
               : act_fp8_ ? DType::kBF16
                          : fc_out_dtype(mixed2_);
  CombineTerms& terms = fa.terms;
  terms.route_position = maps.route_position;
  terms.expert_ids = maps.expert_ids;
  terms.weights = maps.weights;
  terms.expert_begin = static_cast<int32_t>(first);
  terms.expert_end = static_cast<int32_t>(first + held);
  terms.scale_input = scale_input;
  terms.bias = fc2_.bias;
  terms.bias_dtype = fc2_.bias_dtype;
  terms.tokens = tokens;
  terms.hidden = spec_.hidden;
  terms.slots = slots;
  terms.out = out.data;
  terms.out_dtype = out.dtype;
  fa.pdl = pdl;
  const bool combined = decode && tokens <= combine_tokens_;
  if (decode) {
    QMOE_RETURN_IF_ERROR(
        run_decode(in, l, ws, local, combined ? &fa.terms : nullptr, stream, profile));
  } else {
    QMOE_RETURN_IF_ERROR(run_generic(in, l, ws, local, stream, profile, calls, planned));
  }
  if (!combined) QMOE_RETURN_IF_ERROR(launch_finalize(fa, stream));
  if (profile) {
    QMOE_CUDA_TRY(cudaEventRecord(events_[4], stream));
    QMOE_CUDA_TRY(cudaEventSynchronize(events_[4]));
    float ms[4];
    for (int i = 0; i < 4; ++i) {
      QMOE_CUDA_TRY(cudaEventElapsedTime(&ms[i], events_[i], events_[i + 1]));
    }
    profile->route_us = 1000.0 * ms[0];
    profile->fc1_us = 1000.0 * ms[1];
    profile->fc2_us = 1000.0 * ms[2];
    profile->combine_us = 1000.0 * ms[3];
    profile->combine_fused = combined;
  }
  return Status::ok();
}

ActivationArgs CudaLayer::activation_args(const RouteMapsView& maps, const void* h,
                                          const void* h3) const {
  ActivationArgs aa;
  aa.act = spec_.activation;
  aa.inter = spec_.inter;
  aa.h = h;
  aa.ldh = n1p_;
  aa.h3 = spec_.has_fc3() ? h3 : nullptr;
  aa.ldh3 = ip_;
  aa.fc1_bias = fc1_.bias;
  aa.fc3_bias = spec_.has_fc3() ? fc3_.bias : nullptr;
  aa.bias_dtype = fc1_.bias_dtype;
  aa.fc1_rows = spec_.fc1_rows();
  aa.scale_input = spec_.routing.combine == CombineMode::kScaleInput;
  aa.permuted_route = maps.permuted_route;
  aa.expert_ids = maps.expert_ids;
  aa.weights = maps.weights;
  aa.routes = maps.tokens * spec_.slots();
  aa.expert_begin = static_cast<int32_t>(spec_.first_expert);
  aa.expert_end = static_cast<int32_t>(spec_.first_expert + spec_.weight_experts());
  aa.by_route = aa.fc1_bias != nullptr || aa.fc3_bias != nullptr || aa.scale_input ||
                spec_.weight_experts() < spec_.num_experts;
  return aa;
}

// FC1 (+FC3), the activation and FC2 on the mixed-input GEMM or through dequantization and the
// grouped GEMM.
Status CudaLayer::run_generic(const RunInputs& in, const Layout& l, char* ws,
                              const RouteMapsView& maps, cudaStream_t stream, RunProfile* profile,
                              const GenericCalls& calls, bool planned) {
  if (act_fp8_) return run_generic_fp8(in, l, ws, maps, stream, profile);
  const int slots = spec_.slots();
  const int64_t routes = maps.tokens * slots;
  if (!planned) {
    QMOE_RETURN_IF_ERROR(launch_gather(in.input.data, spec_.act_dtype, spec_.hidden,
                                       maps.permuted_route, slots, routes, ws + l.xa, hp_,
                                       error_.as<int32_t>(), stream, calls.pdl));
  }
  QMOE_RETURN_IF_ERROR(run_fc(calls.fc1, l, ws, maps, stream, planned));
  if (!calls.act_epilogue) {
    if (spec_.has_fc3()) QMOE_RETURN_IF_ERROR(run_fc(calls.fc3, l, ws, maps, stream));
    ActivationArgs aa = activation_args(maps, ws + l.hy, ws + l.h3);
    aa.h_dtype = fc_out_dtype(mixed1_);
    aa.h3_dtype = fc_out_dtype(mixed3_);
    aa.banded = act_rows_;  // FC1's columns in GluRows order
    aa.out = ws + l.xa;     // the gathered input is dead once FC1 and FC3 have run
    aa.ld = ip_;
    aa.out_dtype = cdt_;
    aa.pdl = calls.pdl;
    QMOE_RETURN_IF_ERROR(launch_activation(aa, stream));
  }
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[2], stream));
  // FC2 into the FC1 output's space.
  QMOE_RETURN_IF_ERROR(run_fc(calls.fc2, l, ws, maps, stream, planned));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[3], stream));
  return Status::ok();
}

}  // namespace qmoe::cuda

// The CUDA backend's layer: weights uploaded once at prepare, then per call
//   routing (fused single block for decode shapes, CUB for the rest) -> plan (touched experts,
//   GEMM tiles) -> gather (x by route position) -> per wave: dequantize the wave's experts into
//   the scratch, grouped GEMM  [FC1, FC3] -> activation -> per wave [FC2] -> finalize.
// Every buffer of a call lives in the caller's workspace (layout() is the documented formula);
// every launch goes to the caller's stream; nothing waits for the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/formats/mma_pack.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/device_buffer.h"
#include "cuda/cuda_backend.h"
#include "cuda/decode/decode_gemv.h"
#include "cuda/dequant/dequant.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/gemm/cutlass_grouped.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/layer/dispatch.h"
#include "cuda/layer/stages.h"
#include "cuda/routing/device_routing.h"
#include "qmoe/quantize.h"

namespace qmoe {
namespace cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr size_t kDefaultDequantBytes = size_t{1} << 30;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
int64_t pad_k(int64_t k) { return (k + kGemmKAlign - 1) / kGemmKAlign * kGemmKAlign; }

// Restores the caller's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      ok_ = cudaSetDevice(device) == cudaSuccess;
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  bool ok() const { return ok_; }

 private:
  int previous_ = 0;
  bool switched_ = false, ok_ = true;
};

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

// The generic path's GEMM (PrepareOptions::gemm): CUTLASS's mixed-input kernel on the packed codes
// where an FC allows it, else dequantize + CUTLASS; dequantize + CUTLASS always; or dequantize +
// the mma.sync kernel.
enum class GemmChoice { kCutlass, kCutlassDequant, kMma };

// An FC's copy for the mixed-input GEMM (cutlass_mixed.h): signed int4 codes [E, n, k/2] and
// scales [E, k / chunk, n] in the activation dtype. Absent (codes null) where the FC runs through
// the dequantize pass.
struct MixedFc {
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;
  int64_t chunk = 0;
  bool on() const { return codes != nullptr; }
};

class CudaLayer final : public PreparedLayer {
 public:
  // `options` resolved (resolve_prepare_options): the layer keeps what its run path needs.
  CudaLayer(const LayerSpec& spec, const PrepareOptions& options, size_t dequant_cap)
      : spec_(spec),
        device_(options.device),
        dequant_cap_(dequant_cap),
        pdl_(options.pdl),
        decode_options_(options.decode),
        fused_grid_ctas_(options.fused_grid_ctas) {
    cdt_ = spec.act_dtype;
    cs_ = dtype_size(cdt_);
    hp_ = pad_k(spec.hidden);
    ip_ = pad_k(spec.inter);
    n1p_ = pad_k(spec.fc1_rows());
    slot_elems_ = std::max(spec.fc1_rows() * hp_, spec.hidden * ip_);
    if (spec.has_fc3()) slot_elems_ = std::max(slot_elems_, spec.inter * hp_);
  }
  ~CudaLayer() override {
    for (cudaEvent_t& e : events_) {
      if (e) cudaEventDestroy(e);
    }
    if (take_stream_) cudaStreamDestroy(take_stream_);
  }

  Status init(const LayerWeights& w);
  // The generic path's GEMM: CUTLASS (on `sm_count` multiprocessors) for bf16/f16 layers, where
  // an FC's shapes allow it; otherwise the mma.sync kernel. Before the first workspace_size().
  // With `mixed`, FCs the mixed-input kernel takes skip the dequantize pass (init() prepares their
  // copies).
  void set_cutlass(bool on, bool mixed, int sm_count) {
    cutlass_ = on && (cdt_ == DType::kBF16 || cdt_ == DType::kF16);
    mixed_ = cutlass_ && mixed;
    sm_count_ = sm_count;
  }
  // The dispatch table: the analytic default, then the tune file's rows for this layer, if any.
  // A forced choice stays.
  Status load_dispatch(const std::string& tune_file);

  BackendKind backend() const override { return BackendKind::kCuda; }
  const LayerSpec& spec() const override { return spec_; }

  // 0 for max_tokens <= 0: a call of zero tokens touches no memory.
  size_t workspace_size(int64_t max_tokens) const override {
    Layout l;
    return max_tokens > 0 && layout(max_tokens, &l).is_ok() ? l.total : 0;
  }

  Status run(const RunInputs& in, const MutableTensorView& out, void* workspace,
             size_t workspace_bytes, void* stream, RunProfile* profile) override;

  Status take_deferred_error() override;

  std::string dispatch_choice(int64_t tokens) const override {
    return choice_name(dispatch_.choose(tokens));
  }
  Status apply_tune_file(const std::string& tune_file) override { return load_dispatch(tune_file); }
  std::vector<std::string> dispatch_candidates(int64_t tokens) const override {
    return names_of(cuda::dispatch_candidates(decode_ready_, tokens, fused_max_tokens_));
  }
  Status force_dispatch(const std::string& choice) override {
    QMOE_RETURN_IF_ERROR(
        check_forced_choice(choice, names_of(layer_choices(decode_ready_, fused_max_tokens_))));
    set_forced(choice);
    return Status::ok();
  }
  // PrepareOptions::dispatch, its name checked by resolve_prepare_options: unlike
  // force_dispatch(), a decode choice on a layer without the decode path is no error (its calls
  // run the generic path), so one setting serves every layer of an A/B run.
  void set_forced(const std::string& choice) {
    DispatchChoice c;
    dispatch_.force(parse_choice(choice, &c) ? &c : nullptr);
  }

 private:
  // Byte offsets of one call's buffers in the workspace. With R = T * slots, A() rounding up to
  // 256 bytes, cs = sizeof(activation dtype), Xp = X rounded up to a multiple of 32:
  //   maps        A(route_maps_bytes(T, slots, E))
  //   plan        A(4 E) + A(4) + A(4 (E + 1))          touched, n_touched, tile_start
  //   route_temp  A(general_routing_temp_bytes(T))      0 when T <= 64 (the fused routing path)
  //   xa          A(cs R max(Hp, Ip))                   gathered input, later the activation
  //   hy          A(4 R max(N1p + [Ip with FC3], Hp))   FC1 (+FC3) outputs, later FC2's
  //   scratch     A(cs S max(N1 Hp, [I Hp], H Ip))      dequantized weights of S experts
  //   cutlass     A(cutlass_gemm_workspace_bytes(S))    the CUTLASS GEMM's group arrays and TMA
  //                                                     descriptors (layers on CUTLASS only)
  //   mixed       A(mixed_gemm_workspace_bytes(min(E, R)))  the mixed-input GEMM's (layers with a
  //                                                     mixed-input FC only)
  //   fused       max over T' <= min(T, F) of           the fused kernel's partial sums (layers
  //               fused_decode_workspace_bytes(T')      it takes; F = fused_max_tokens_): the
  //                                                     maximum keeps the total monotone in T
  // S = max(1, min(E, R, floor(max_dequant_bytes / (cs max(...))))): a call never needs more
  // slots than it can touch experts, so decode shapes get a small scratch. Where every FC runs
  // on the mixed-input GEMM nothing is dequantized: scratch and cutlass are 0.
  struct Layout {
    size_t maps, touched, n_touched, tile_start, route_temp, route_temp_bytes, xa, hy, h3, scratch,
        cutlass, mixed, fused, total;
    int64_t slots_in_scratch, waves;
  };

  Status layout(int64_t t, Layout* l) const {
    const int slots = spec_.slots();
    const int64_t E = spec_.num_experts;
    const int64_t r = t * slots;
    size_t off = 0;
    auto take = [&off](size_t bytes) {
      const size_t at = off;
      off += align_up(bytes);
      return at;
    };
    l->maps = take(route_maps_bytes(t, slots, E));
    l->touched = take(4 * E);
    l->n_touched = take(4);
    l->tile_start = take(4 * (E + 1));
    size_t temp = 0;
    QMOE_RETURN_IF_ERROR(general_routing_temp_bytes(t, slots, E, &temp));
    l->route_temp_bytes = temp;
    l->route_temp = take(temp);
    l->xa = take(cs_ * r * std::max(hp_, ip_));
    const int64_t h_cols = n1p_ + (spec_.has_fc3() ? ip_ : 0);
    l->hy = take(4 * r * std::max(h_cols, hp_));
    l->h3 = l->hy + 4 * r * n1p_;
    const int64_t per_slot = static_cast<int64_t>(cs_) * slot_elems_;
    const int64_t by_cap = static_cast<int64_t>(dequant_cap_ / static_cast<size_t>(per_slot));
    const int64_t reach = std::min<int64_t>(E, r);
    l->slots_in_scratch = std::max<int64_t>(1, std::min(reach, by_cap));
    l->waves = reach == 0 ? 0 : (reach + l->slots_in_scratch - 1) / l->slots_in_scratch;
    const bool dequant = !all_mixed();
    l->scratch = take(static_cast<size_t>(per_slot) * (t > 0 && dequant ? l->slots_in_scratch : 0));
    l->cutlass = take(cutlass_ && dequant && t > 0
                          ? cutlass_gemm_workspace_bytes(cdt_, l->slots_in_scratch, sm_count_)
                          : 0);
    const bool any_mixed = mixed1_.on() || mixed2_.on() || mixed3_.on();
    l->mixed = take(any_mixed && t > 0 ? mixed_gemm_workspace_bytes(cdt_, reach, sm_count_) : 0);
    l->fused = take(fused_ws_.empty()
                        ? 0
                        : fused_ws_[static_cast<size_t>(std::min<int64_t>(t, fused_max_tokens_))]);
    l->total = off;
    return Status::ok();
  }

  // codes: upload the codes and scales in ORT's layout (FP4 and FP8 that the decode path packs
  // keep only the packed copy).
  Status upload_fc(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, bool codes,
                   DeviceFc* out);
  // Whether the decode path takes this layer (sets pack1_ and pack2_).
  bool plan_decode();
  Status pack_for_decode(const LayerWeights& w);
  Status run_decode(const RunInputs& in, const Layout& l, char* ws, const RouteMapsView& maps,
                    int route_groups, cudaStream_t stream, RunProfile* profile);
  Status run_generic(const RunInputs& in, const Layout& l, char* ws, const RouteMapsView& maps,
                     cudaStream_t stream, RunProfile* profile);
  // The whole call in the fused kernel.
  // With a profile, the kernel's stamps (fused_decode.h) give the stages: route (the slowest
  // CTA's routing), fc1 (the busiest CTA's staging and FC1), fc2 (its FC2) and combine (from the
  // last CTA's items to the end: the grid barrier's wait and the combine).
  Status run_fused(const RunInputs& in, const MutableTensorView& out, const Layout& l, char* ws,
                   int64_t tokens, cudaStream_t stream, RunProfile* profile);
  // Whether the fused kernel takes this layer (after pack_for_decode), and up to what count.
  Status plan_fused();
  Status upload(const TensorView& v, const void** dst);
  Status run_fc(const DeviceFc& fc, const MixedFc& mx, const Layout& l, char* ws,
                const RouteMapsView& maps, const void* a, int64_t lda, float* c, int64_t ldc,
                int64_t ld_b, cudaStream_t stream);
  // The mixed-input copy of one FC, where the GEMM choice and the FC allow it.
  Status prepare_mixed(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, MixedFc* out);
  bool all_mixed() const {
    return mixed1_.on() && mixed2_.on() && (!spec_.has_fc3() || mixed3_.on());
  }

  static std::vector<std::string> names_of(const std::vector<DispatchChoice>& choices) {
    std::vector<std::string> names;
    for (const DispatchChoice& c : choices) names.push_back(choice_name(c));
    return names;
  }

  LayerSpec spec_;
  int device_;
  size_t dequant_cap_;
  bool pdl_;                      // PrepareOptions::pdl
  DecodeOptions decode_options_;  // PrepareOptions::decode
  DType cdt_;
  size_t cs_;
  int64_t hp_, ip_, n1p_, slot_elems_;
  DeviceFc fc1_, fc2_, fc3_;
  // The decode path's copies of FC1 and FC2 in the tensor-core fragment layout (mma_pack.h),
  // present when both FCs are formats that layout supports (plan_decode).
  bool decode_planned_ = false, decode_ready_ = false;
  FusedShape fused_shape_;
  int64_t fused_max_tokens_ = 0;  // 0: the fused kernel does not take this layer
  int fused_grid_ctas_ = 0;       // PrepareOptions::fused_grid_ctas (0: as many as fit)
  DeviceBuffer fused_stamps_;     // profiled calls only (they take turns: profile_mu_)
  std::vector<size_t> fused_ws_;  // [0, F]: the layout's fused entry by token count
  DispatchTable dispatch_;
  bool cutlass_ = false;  // set_cutlass()
  bool mixed_ = false;    // set_cutlass()
  MixedFc mixed1_, mixed2_, mixed3_;
  int sm_count_ = 0;
  MmaPackShape pack1_, pack2_;
  const uint32_t* packed1_ = nullptr;
  const uint32_t* packed2_ = nullptr;
  // Their scales and zero points in tile order (mma_pack_scales), as the decode kernel reads them.
  const uint8_t* tiled_scales1_ = nullptr;
  const uint8_t* tiled_scales2_ = nullptr;
  const uint8_t* tiled_zp1_ = nullptr;
  const uint8_t* tiled_zp2_ = nullptr;
  std::vector<DeviceBuffer> buffers_;
  const float* router_bias_ = nullptr;
  // int32[4]: the record every call adds to (error bits, first token; see device_routing.h),
  // then take_error_kernel's copy of it.
  DeviceBuffer error_;
  std::mutex take_mu_;                  // one take_deferred_error() at a time
  cudaStream_t take_stream_ = nullptr;  // non-blocking: a take never waits on the legacy stream
  // The profile's events: one set per layer, so calls with a profile take turns (profile_mu_).
  std::mutex profile_mu_;
  cudaEvent_t events_[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
};

Status CudaLayer::upload(const TensorView& v, const void** dst) {
  *dst = nullptr;
  if (!v.present()) return Status::ok();
  DeviceBuffer b;
  QMOE_RETURN_IF_ERROR(b.allocate(v.bytes()));
  // cudaMemcpyDefault: the source may be host or device memory.
  QMOE_CUDA_TRY(cudaMemcpy(b.get(), v.data, v.bytes(), cudaMemcpyDefault));
  *dst = b.get();
  buffers_.push_back(std::move(b));
  return Status::ok();
}

Status CudaLayer::upload_fc(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, bool codes,
                            DeviceFc* out) {
  out->format = f;
  out->n = n;
  out->k = k;
  const void* p = nullptr;
  if (!codes) {  // the codes and scales live in the packed copy only
    out->format.fp4_layout = Fp4Layout::kKPacked;
  } else if (f.info().kind == FormatKind::kFp4 && f.fp4_layout == Fp4Layout::kNPacked) {
    // The kernels read K-packed rows; repack ORT's N-packed layout once, exactly.
    std::vector<uint8_t> src(w.weight.bytes()), dst(w.weight.bytes());
    QMOE_CUDA_TRY(cudaMemcpy(src.data(), w.weight.data, src.size(), cudaMemcpyDefault));
    fp4_repack(Fp4Layout::kNPacked, src.data(), spec_.num_experts, n, k, dst.data());
    QMOE_RETURN_IF_ERROR(
        upload(TensorView(dst.data(), DType::kU8, {static_cast<int64_t>(dst.size())}), &p));
    out->format.fp4_layout = Fp4Layout::kKPacked;
  } else {
    QMOE_RETURN_IF_ERROR(upload(w.weight, &p));
  }
  out->weight = static_cast<const uint8_t*>(p);
  if (codes) QMOE_RETURN_IF_ERROR(upload(w.scales, &p));
  out->scales = static_cast<const uint8_t*>(p);
  QMOE_RETURN_IF_ERROR(upload(w.zero_points, &p));
  out->zero_points = f.zero_points ? static_cast<const uint8_t*>(p) : nullptr;
  QMOE_RETURN_IF_ERROR(upload(w.global_scale, &p));
  out->global_scale = static_cast<const float*>(p);
  QMOE_RETURN_IF_ERROR(upload(w.bias, &p));
  out->bias = p;
  out->bias_dtype = w.bias.present() ? w.bias.dtype : spec_.act_dtype;
  return Status::ok();
}

Status CudaLayer::init(const LayerWeights& w) {
  // FP4 and FP8 FCs the decode path packs keep only that copy (pack_for_decode).
  decode_planned_ = plan_decode();
  auto raw = [&](const FcFormat& f) {
    return !decode_planned_ ||
           (f.info().kind != FormatKind::kFp4 && f.info().kind != FormatKind::kFp8);
  };
  // A separate FC3 the decode path takes lives in FC1's packed copy (plan_decode).
  QMOE_RETURN_IF_ERROR(
      upload_fc(spec_.fc1, w.fc1, spec_.fc1_rows(), spec_.hidden, raw(spec_.fc1), &fc1_));
  QMOE_RETURN_IF_ERROR(
      upload_fc(spec_.fc2, w.fc2, spec_.hidden, spec_.inter, raw(spec_.fc2), &fc2_));
  if (spec_.has_fc3()) {
    QMOE_RETURN_IF_ERROR(
        upload_fc(spec_.fc3, w.fc3, spec_.inter, spec_.hidden, raw(spec_.fc3), &fc3_));
  }
  const void* p = nullptr;
  if (spec_.routing.method == RoutingMethod::kGroupedTopK) {
    QMOE_RETURN_IF_ERROR(upload(w.router_bias, &p));
    router_bias_ = static_cast<const float*>(p);
  }
  QMOE_RETURN_IF_ERROR(pack_for_decode(w));
  QMOE_RETURN_IF_ERROR(plan_fused());
  QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc1, w.fc1, spec_.fc1_rows(), spec_.hidden, &mixed1_));
  QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc2, w.fc2, spec_.hidden, spec_.inter, &mixed2_));
  if (spec_.has_fc3()) {
    QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc3, w.fc3, spec_.inter, spec_.hidden, &mixed3_));
  }
  const int32_t clear[4] = {0, INT32_MAX, 0, INT32_MAX};
  QMOE_RETURN_IF_ERROR(error_.upload(clear, sizeof(clear)));
  for (cudaEvent_t& e : events_) QMOE_CUDA_TRY(cudaEventCreate(&e));
  QMOE_CUDA_TRY(cudaStreamCreateWithFlags(&take_stream_, cudaStreamNonBlocking));
  return Status::ok();
}

// A copy beside ORT's (dequantize fallback) and the decode path's: built on the host once.
Status CudaLayer::prepare_mixed(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k,
                                MixedFc* out) {
  *out = MixedFc{};
  if (!mixed_ || !mixed_int4_supported(f, cdt_, n, k)) return Status::ok();
  std::vector<uint8_t> codes(w.weight.bytes()), scales(w.scales.bytes()), signed_codes;
  QMOE_CUDA_TRY(cudaMemcpy(codes.data(), w.weight.data, codes.size(), cudaMemcpyDefault));
  QMOE_CUDA_TRY(cudaMemcpy(scales.data(), w.scales.data, scales.size(), cudaMemcpyDefault));
  std::vector<uint16_t> scales_t;
  mixed_int4_prepare(f, cdt_, spec_.num_experts, n, k, codes.data(), scales.data(), &signed_codes,
                     &scales_t);
  const void* p = nullptr;
  QMOE_RETURN_IF_ERROR(upload(
      TensorView(signed_codes.data(), DType::kU8, {static_cast<int64_t>(signed_codes.size())}),
      &p));
  out->codes = static_cast<const uint8_t*>(p);
  QMOE_RETURN_IF_ERROR(upload(
      TensorView(scales_t.data(), DType::kU8, {static_cast<int64_t>(2 * scales_t.size())}), &p));
  out->scales = p;
  out->chunk = f.block_size == 0 ? k : f.block_size;
  return Status::ok();
}

// The decode path runs bf16/f16 layers whose FC1 and FC2 are integer formats of 2, 3, 4 or 8 bits
// (blocks >= 16 or per channel), NVFP4/MXFP4 or fp8/fp8_block (blocks >= 32), K a multiple of 16,
// with FC1 and the gate in one tensor, or FP8 with a separate FC3 (the linear half) of FC1's
// format and no FC1/FC3 biases: FC1 and FC3 then pack as one gated concatenated FC (gate rows from
// FC1, linear rows from FC3), their scales per row (fp8's global scales as f32).
bool CudaLayer::plan_decode() {
  const bool dtype_ok = spec_.act_dtype == DType::kBF16 || spec_.act_dtype == DType::kF16;
  const FcFormat &f1 = spec_.fc1, &f3 = spec_.fc3;
  const bool fc3_ok = !spec_.has_fc3() ||
                      (f1.info().kind == FormatKind::kFp8 && f3.format == f1.format &&
                       f3.block_size == f1.block_size && f3.scale_dtype == f1.scale_dtype &&
                       (f1.format == WeightFormat::kFp8Block || f1.scale_dtype == DType::kF32) &&
                       !spec_.has_fc1_bias && !spec_.has_fc3_bias);
  if (!dtype_ok || !fc3_ok || !mma_pack_supported(spec_.fc1, spec_.hidden) ||
      !mma_pack_supported(spec_.fc2, spec_.inter)) {
    return false;
  }
  MmaRowMap map1 = MmaRowMap::kIdentity;
  if (spec_.activation.gated()) {
    map1 = spec_.activation.glu == GluLayout::kInterleaved ? MmaRowMap::kGatedInterleaved
                                                           : MmaRowMap::kGatedConcatenated;
  }
  const int64_t rows1 = spec_.has_fc3() ? 2 * spec_.inter : spec_.fc1_rows();
  pack1_ = mma_pack_shape(spec_.fc1, rows1, spec_.hidden, map1, spec_.inter, spec_.act_dtype);
  if (spec_.has_fc3()) pack1_.scale_rows = 1;  // scales expanded per row (pack_for_decode)
  pack2_ = mma_pack_shape(spec_.fc2, spec_.hidden, spec_.inter, MmaRowMap::kIdentity, spec_.inter,
                          spec_.act_dtype);
  return decode_fits(pack1_, spec_.fc1.zero_points) && decode_fits(pack2_, spec_.fc2.zero_points);
}

Status CudaLayer::pack_for_decode(const LayerWeights& w) {
  if (!decode_planned_) return Status::ok();
  QMOE_RETURN_IF_ERROR(prepare_decode_kernels());
  const int64_t E = spec_.num_experts;
  auto to_host = [](const TensorView& v, std::vector<uint8_t>* host) -> Status {
    host->resize(v.bytes());
    QMOE_CUDA_TRY(cudaMemcpy(host->data(), v.data, host->size(), cudaMemcpyDefault));
    return Status::ok();
  };
  // The packed words and the tile-ordered scales or zero points, uploaded.
  auto upload_vector = [&](const auto& v, auto** dst) -> Status {
    const void* p = nullptr;
    const int64_t bytes = static_cast<int64_t>(v.size() * sizeof(v[0]));
    QMOE_RETURN_IF_ERROR(upload(TensorView(v.data(), DType::kU8, {bytes}), &p));
    *dst = static_cast<std::remove_reference_t<decltype(*dst)>>(p);
    return Status::ok();
  };
  // FP4: K-packed codes (ORT's N-packed layout repacked) and the 8-bit scales in tile order (NVFP4
  // in blocks of 16 over the padded K). The kernels turn the scales into what they apply.
  auto pack_fp4 = [&](const FcFormat& f, const FcWeights& fw, const MmaPackShape& shape,
                      const uint32_t** packed, const uint8_t** scales) -> Status {
    std::vector<uint8_t> host, k_packed;
    QMOE_RETURN_IF_ERROR(to_host(fw.weight, &host));
    if (f.fp4_layout == Fp4Layout::kNPacked) {
      k_packed.resize(host.size());
      fp4_repack(Fp4Layout::kNPacked, host.data(), E, shape.n, shape.k, k_packed.data());
      host.swap(k_packed);
    }
    std::vector<uint32_t> words;
    mma_pack_fp4(shape, host.data(), E, &words);
    QMOE_RETURN_IF_ERROR(upload_vector(words, packed));
    QMOE_RETURN_IF_ERROR(to_host(fw.scales, &host));
    std::vector<uint8_t> tiled;
    mma_pack_scales(mma_fp4_scale_shape(shape), host.data(), 1, E, &tiled);
    QMOE_RETURN_IF_ERROR(upload_vector(tiled, scales));
    return Status::ok();
  };
  // FP8: the e4m3 codes; fp8_block's scales per packed row in tile order, fp8 none (its global).
  auto pack_fp8 = [&](const FcFormat& f, const FcWeights& fw, const MmaPackShape& shape,
                      const uint32_t** packed, const uint8_t** scales) -> Status {
    std::vector<uint8_t> host;
    QMOE_RETURN_IF_ERROR(to_host(fw.weight, &host));
    std::vector<uint32_t> words;
    mma_pack_fp8(shape, host.data(), E, &words);
    QMOE_RETURN_IF_ERROR(upload_vector(words, packed));
    *scales = nullptr;
    if (shape.block_size == 0) return Status::ok();
    QMOE_RETURN_IF_ERROR(to_host(fw.scales, &host));
    std::vector<uint8_t> tiled;
    mma_pack_scales(shape, host.data(), static_cast<int>(dtype_size(f.scale_dtype)), E, &tiled);
    QMOE_RETURN_IF_ERROR(upload_vector(tiled, scales));
    return Status::ok();
  };
  // FP8 FC1 (gate) and a separate FC3 (linear) as one FC (plan_decode): the codes of both, and
  // each row's scales (fp8_block's block of rows; fp8's global scale, f32) in tile order.
  auto pack_fp8_fc3 = [&](const FcFormat& f, const MmaPackShape& shape, const uint32_t** packed,
                          const uint8_t** scales) -> Status {
    const bool block = f.format == WeightFormat::kFp8Block;
    const int eb = block ? static_cast<int>(dtype_size(f.scale_dtype)) : 4;
    std::vector<uint8_t> gate, lin, src[2];
    QMOE_RETURN_IF_ERROR(to_host(w.fc1.weight, &gate));
    QMOE_RETURN_IF_ERROR(to_host(w.fc3.weight, &lin));
    std::vector<uint32_t> words;
    mma_pack_fp8(shape, gate.data(), E, &words, lin.data());
    QMOE_RETURN_IF_ERROR(upload_vector(words, packed));
    QMOE_RETURN_IF_ERROR(to_host(block ? w.fc1.scales : w.fc1.global_scale, &src[0]));
    QMOE_RETURN_IF_ERROR(to_host(block ? w.fc3.scales : w.fc3.global_scale, &src[1]));
    std::vector<uint8_t> rows, tiled;
    mma_gated_row_scales(shape, src[0].data(), src[1].data(), eb,
                         block ? f.block_size : spec_.inter, E, &rows);
    mma_pack_scales(shape, rows.data(), eb, E, &tiled);
    QMOE_RETURN_IF_ERROR(upload_vector(tiled, scales));
    return Status::ok();
  };
  auto pack = [&](const FcFormat& f, const FcWeights& fw, const MmaPackShape& shape,
                  const uint32_t** packed, const uint8_t** scales, const uint8_t** zp) -> Status {
    *zp = nullptr;
    if (shape.codes == MmaCodes::kFp8 && &fw == &w.fc1 && spec_.has_fc3()) {
      return pack_fp8_fc3(f, shape, packed, scales);
    }
    if (shape.codes == MmaCodes::kFp8) return pack_fp8(f, fw, shape, packed, scales);
    if (shape.codes != MmaCodes::kInt) return pack_fp4(f, fw, shape, packed, scales);
    std::vector<uint8_t> host;
    QMOE_RETURN_IF_ERROR(to_host(fw.weight, &host));
    std::vector<uint32_t> words;
    mma_pack_int(shape, host.data(), E, &words);
    QMOE_RETURN_IF_ERROR(upload_vector(words, packed));
    std::vector<uint8_t> tiled;
    QMOE_RETURN_IF_ERROR(to_host(fw.scales, &host));
    mma_pack_scales(shape, host.data(), static_cast<int>(dtype_size(f.scale_dtype)), E, &tiled);
    QMOE_RETURN_IF_ERROR(upload_vector(tiled, scales));
    if (f.zero_points) {
      QMOE_RETURN_IF_ERROR(to_host(fw.zero_points, &host));
      mma_pack_zero_points(shape, host.data(), E, &tiled);
      QMOE_RETURN_IF_ERROR(upload_vector(tiled, zp));
    }
    return Status::ok();
  };
  QMOE_RETURN_IF_ERROR(pack(spec_.fc1, w.fc1, pack1_, &packed1_, &tiled_scales1_, &tiled_zp1_));
  QMOE_RETURN_IF_ERROR(pack(spec_.fc2, w.fc2, pack2_, &packed2_, &tiled_scales2_, &tiled_zp2_));
  // FP4 and FP8 FCs keep only this copy: the generic path dequantizes from it (a separate FC3
  // from FC1's, its rows from I on).
  for (auto [fc, shape, words, scales, row0] :
       {std::tuple{&fc1_, &pack1_, packed1_, tiled_scales1_, int64_t{0}},
        std::tuple{&fc2_, &pack2_, packed2_, tiled_scales2_, int64_t{0}},
        std::tuple{&fc3_, &pack1_, packed1_, tiled_scales1_, spec_.inter}}) {
    if (shape->codes == MmaCodes::kInt || (fc == &fc3_ && !spec_.has_fc3())) continue;
    fc->packed = *shape;
    fc->packed_words = words;
    fc->packed_scales = scales;
    fc->packed_row0 = row0;
  }
  decode_ready_ = true;
  return Status::ok();
}

Status CudaLayer::plan_fused() {
  if (!decode_ready_ || spec_.has_fc3()) return Status::ok();
  FusedShape f;
  f.fc1 = pack1_;
  f.fc2 = pack2_;
  f.zp1 = tiled_zp1_ != nullptr;
  f.zp2 = tiled_zp2_ != nullptr;
  f.experts = static_cast<int>(spec_.num_experts);
  f.slots = spec_.slots();
  f.hidden = spec_.hidden;
  f.inter = spec_.inter;
  if (!fused_decode_supports(f, cdt_)) return Status::ok();
  QMOE_RETURN_IF_ERROR(prepare_fused_decode());
  fused_shape_ = f;
  fused_max_tokens_ = kFusedDecodeMaxTokens;
  fused_ws_.assign(static_cast<size_t>(fused_max_tokens_) + 1, 0);
  for (int t = 1; t <= fused_max_tokens_; ++t) {
    fused_ws_[t] = std::max(fused_ws_[t - 1], fused_decode_workspace_bytes(f, t));
  }
  return Status::ok();
}

Status CudaLayer::run_fused(const RunInputs& in, const MutableTensorView& out, const Layout& l,
                            char* ws, int64_t tokens, cudaStream_t stream, RunProfile* profile) {
  FusedDecodeArgs a;
  a.routing = spec_.routing;
  a.experts = static_cast<int>(spec_.num_experts);
  a.slots = spec_.slots();
  a.tokens = static_cast<int>(tokens);
  a.logits = in.router_logits.data;
  a.logits_dtype = in.router_logits.dtype;
  a.router_weights = in.router_weights.data;
  a.rw_dtype = in.router_weights.present() ? in.router_weights.dtype : DType::kF32;
  a.router_bias = router_bias_;
  auto fc = [](const MmaPackShape& shape, const uint32_t* packed, const uint8_t* scales,
               DType scale_dtype, const uint8_t* zp, const DeviceFc& d) {
    FusedFc f;
    f.shape = shape;
    f.packed = packed;
    f.scales = scales;
    f.scale_dtype = scale_dtype;
    f.zero_points = zp;
    f.bias = d.bias;
    f.bias_dtype = d.bias_dtype;
    return f;
  };
  a.fc1 = fc(pack1_, packed1_, tiled_scales1_, spec_.fc1.scale_dtype, tiled_zp1_, fc1_);
  a.fc2 = fc(pack2_, packed2_, tiled_scales2_, spec_.fc2.scale_dtype, tiled_zp2_, fc2_);
  a.dtype = cdt_;
  a.act = spec_.activation;
  a.scale_input = spec_.routing.combine == CombineMode::kScaleInput;
  a.hidden = spec_.hidden;
  a.inter = spec_.inter;
  a.x = in.input.data;
  a.out = out.data;
  a.out_dtype = out.dtype;
  a.partial = reinterpret_cast<float*>(ws + l.fused);
  a.error = error_.as<int32_t>();
  if (profile == nullptr) return launch_fused_decode(a, fused_grid_ctas_, stream);
  int max_ctas = 0, ctas = 0;
  QMOE_RETURN_IF_ERROR(fused_decode_max_ctas(&max_ctas));
  const size_t bytes = sizeof(unsigned long long) * kFusedStamps * static_cast<size_t>(max_ctas);
  if (fused_stamps_.bytes() < bytes) QMOE_RETURN_IF_ERROR(fused_stamps_.allocate(bytes));
  a.stamps = fused_stamps_.as<unsigned long long>();
  QMOE_RETURN_IF_ERROR(launch_fused_decode(a, fused_grid_ctas_, stream, &ctas));
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
    if (s[kStampStageNs] + s[kStampFc1Ns] + s[kStampFc2Ns] >= busy + fc2) {
      busy = s[kStampStageNs] + s[kStampFc1Ns];
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
                             const RouteMapsView& maps, int route_groups, cudaStream_t stream,
                             RunProfile* profile) {
  const int tokens = static_cast<int>(maps.tokens);
  DecodeFcArgs d;
  d.touched = reinterpret_cast<const int32_t*>(ws + l.touched);
  d.n_touched = reinterpret_cast<const int32_t*>(ws + l.n_touched);
  d.offsets = maps.expert_offsets;
  d.max_groups =
      static_cast<int>(std::min<int64_t>(spec_.num_experts, maps.tokens * spec_.slots()));
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
  QMOE_RETURN_IF_ERROR(launch_decode_fc(d, tokens, route_groups, tiles_per_block, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[2], stream));

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
  QMOE_RETURN_IF_ERROR(launch_decode_fc(d, tokens, route_groups, tiles_per_block, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[3], stream));
  return Status::ok();
}

Status CudaLayer::load_dispatch(const std::string& tune_file) {
  DispatchTable table(decode_ready_, spec_.slots(), spec_.num_experts, all_mixed(),
                      fused_max_tokens_);
  table.force(dispatch_.forced());
  if (!tune_file.empty()) {
    cudaDeviceProp prop;
    QMOE_CUDA_TRY(cudaGetDeviceProperties(&prop, device_));
    std::vector<TunedRow> rows;
    bool found = false;
    QMOE_RETURN_IF_ERROR(load_tuned_rows(tune_file, tune_key(spec_, prop.name), &rows, &found));
    if (found) QMOE_RETURN_IF_ERROR(table.apply_tuned(rows));
  }
  dispatch_ = table;  // only once the file has been read whole
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

// One FC: the mixed-input GEMM on the FC's prepared codes in one launch, or, over every wave,
// dequantize the wave's experts, then the grouped GEMM into c.
Status CudaLayer::run_fc(const DeviceFc& fc, const MixedFc& mx, const Layout& l, char* ws,
                         const RouteMapsView& maps, const void* a, int64_t lda, float* c,
                         int64_t ldc, int64_t ld_b, cudaStream_t stream) {
  const int32_t* touched = reinterpret_cast<const int32_t*>(ws + l.touched);
  const int32_t* n_touched = reinterpret_cast<const int32_t*>(ws + l.n_touched);
  const int32_t* tile_start = reinterpret_cast<const int32_t*>(ws + l.tile_start);
  const int64_t routes = maps.tokens * spec_.slots();
  if (mx.on()) {
    // No fallback: the layout may hold no scratch. The strides and workspace pointers always
    // qualify (multiples of 32 elements, 256-byte aligned); launch_mixed_grouped_gemm checks.
    MixedGemmArgs m;
    m.dtype = cdt_;
    m.a = a;
    m.lda = lda;
    m.c = c;
    m.ldc = ldc;
    m.n = fc.n;
    m.k = fc.k;
    m.codes = mx.codes;
    m.scales = mx.scales;
    m.chunk = mx.chunk;
    m.sched.touched = touched;
    m.sched.n_touched = n_touched;
    m.sched.offsets = maps.expert_offsets;
    m.max_groups = static_cast<int>(std::min<int64_t>(spec_.num_experts, routes));
    return launch_mixed_grouped_gemm(m, sm_count_, ws + l.mixed, l.total - l.mixed, stream);
  }
  const int s = static_cast<int>(l.slots_in_scratch);
  for (int64_t wave = 0; wave < l.waves; ++wave) {
    DequantArgs d;
    d.fc = fc;
    d.out_dtype = cdt_;
    d.out = ws + l.scratch;
    d.ld = ld_b;
    d.slot_stride = fc.n * ld_b;
    d.touched = touched;
    d.n_touched = n_touched;
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
    g.c = c;
    g.ldc = ldc;
    g.n = fc.n;
    g.k = ld_b;
    g.sched.touched = touched;
    g.sched.n_touched = n_touched;
    g.sched.offsets = maps.expert_offsets;
    g.sched.tile_start = tile_start;
    g.first_group = d.first_group;
    g.max_groups = s;
    g.max_tiles = std::min<int64_t>(routes, (routes + kGemmTileM - 1) / kGemmTileM + s);
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
  ra.pdl = pdl_;
  // The fused routing kernel builds the plan too; the general path leaves it to launch_plan.
  const bool fused = fused_routing_applies(tokens, slots, spec_.num_experts);
  int32_t* touched = reinterpret_cast<int32_t*>(ws + l.touched);
  int32_t* n_touched = reinterpret_cast<int32_t*>(ws + l.n_touched);
  int32_t* tile_start = reinterpret_cast<int32_t*>(ws + l.tile_start);
  if (fused) {
    ra.plan_touched = touched;
    ra.plan_n_touched = n_touched;
    ra.plan_tile_start = tile_start;
    ra.plan_tile_m = kGemmTileM;
  }
  QMOE_RETURN_IF_ERROR(launch_routing(ra, ws + l.route_temp, l.route_temp_bytes, stream));
  if (!fused) {
    QMOE_RETURN_IF_ERROR(
        launch_plan(maps.expert_counts, spec_.num_experts, touched, n_touched, tile_start, stream));
  }
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[1], stream));

  const bool decode =
      choice.path == CallPath::kDecode && reinterpret_cast<uintptr_t>(in.input.data) % 16 == 0;
  const bool scale_input = spec_.routing.combine == CombineMode::kScaleInput;
  FinalizeArgs fa;
  fa.y = reinterpret_cast<float*>(ws + l.hy);
  fa.ldy = hp_;
  fa.fc2_bias = fc2_.bias;
  fa.bias_dtype = fc2_.bias_dtype;
  fa.route_position = maps.route_position;
  fa.expert_ids = maps.expert_ids;
  fa.weights = maps.weights;
  fa.scale_input = scale_input;
  fa.tokens = tokens;
  fa.hidden = spec_.hidden;
  fa.slots = slots;
  fa.out = out.data;
  fa.out_dtype = out.dtype;
  fa.pdl = pdl_;
  if (decode) {
    QMOE_RETURN_IF_ERROR(run_decode(in, l, ws, maps, choice.route_groups, stream, profile));
  } else {
    QMOE_RETURN_IF_ERROR(run_generic(in, l, ws, maps, stream, profile));
  }
  QMOE_RETURN_IF_ERROR(launch_finalize(fa, stream));
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
    profile->combine_fused = false;
  }
  return Status::ok();
}

// FC1 (+FC3), the activation and FC2 through dequantization and the grouped GEMM.
Status CudaLayer::run_generic(const RunInputs& in, const Layout& l, char* ws,
                              const RouteMapsView& maps, cudaStream_t stream, RunProfile* profile) {
  const int slots = spec_.slots();
  const int64_t routes = maps.tokens * slots;
  void* xa = ws + l.xa;
  float* h = reinterpret_cast<float*>(ws + l.hy);
  float* h3 = reinterpret_cast<float*>(ws + l.h3);
  QMOE_RETURN_IF_ERROR(launch_gather(in.input.data, spec_.act_dtype, spec_.hidden,
                                     maps.permuted_route, slots, routes, xa, hp_,
                                     error_.as<int32_t>(), stream));
  QMOE_RETURN_IF_ERROR(run_fc(fc1_, mixed1_, l, ws, maps, xa, hp_, h, n1p_, hp_, stream));
  if (spec_.has_fc3()) {
    QMOE_RETURN_IF_ERROR(run_fc(fc3_, mixed3_, l, ws, maps, xa, hp_, h3, ip_, hp_, stream));
  }
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
  aa.routes = routes;
  aa.out = xa;  // the gathered input is dead once FC1 and FC3 have run
  aa.ld = ip_;
  aa.out_dtype = cdt_;
  QMOE_RETURN_IF_ERROR(launch_activation(aa, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[2], stream));

  // FC2 into the FC1 output's space.
  QMOE_RETURN_IF_ERROR(run_fc(fc2_, mixed2_, l, ws, maps, xa, ip_, h, hp_, ip_, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[3], stream));
  return Status::ok();
}

// PrepareOptions::gemm, resolved (checked by resolve_prepare_options): empty is "cutlass".
GemmChoice gemm_choice(const std::string& gemm) {
  if (gemm == "cutlass-dequant") return GemmChoice::kCutlassDequant;
  if (gemm == "mma") return GemmChoice::kMma;
  return GemmChoice::kCutlass;
}

// What the GPU path cannot run, checked before anything is uploaded.
Status check_cuda_support(const LayerSpec& spec) {
  if (spec.num_experts > kGeneralMaxExperts) {
    return Status::unsupported("num_experts: the CUDA backend routes up to " +
                               std::to_string(kGeneralMaxExperts) + " experts, got " +
                               std::to_string(spec.num_experts));
  }
  const int64_t routes_per_token = spec.slots();
  if (spec.hidden > (int64_t{1} << 24) || spec.inter > (int64_t{1} << 24) ||
      routes_per_token > 1024) {
    return Status::unsupported(
        "hidden/inter/slots: the CUDA backend supports H, I <= 2^24 and "
        "top_k + shared <= 1024");
  }
  return Status::ok();
}

}  // namespace
}  // namespace cuda

bool cuda_backend_available(std::string* why_not) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    cudaGetLastError();
    if (why_not) *why_not = "no CUDA device";
    return false;
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) {
    if (why_not) {
      *why_not = "device 0 is sm_" + std::to_string(major) + std::to_string(minor) +
                 "; this build's kernels are for sm_90a (Hopper)";
    }
    return false;
  }
  return true;
}

Status prepare_cuda_layer(const LayerSpec& spec, const LayerWeights& weights,
                          const PrepareOptions& given, std::unique_ptr<PreparedLayer>* out) {
  QMOE_RETURN_IF_ERROR(check_layer(spec, weights));
  PrepareOptions options;  // the caller's, with the environment's overrides: read here only
  QMOE_RETURN_IF_ERROR(resolve_prepare_options(given, &options));
  QMOE_RETURN_IF_ERROR(cuda::check_cuda_support(spec));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
    cudaGetLastError();
    return Status::unsupported("backend cuda: no CUDA device");
  }
  if (options.device < 0 || options.device >= count) {
    return Status::invalid("device: expected 0.." + std::to_string(count - 1) + ", got " +
                           std::to_string(options.device));
  }
  int major = 0, minor = 0;
  QMOE_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options.device));
  QMOE_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options.device));
  if (major != 9 || minor != 0) {
    return Status::unsupported("backend cuda: device " + std::to_string(options.device) +
                               " is sm_" + std::to_string(major) + std::to_string(minor) +
                               "; this build's kernels are for sm_90a (Hopper)");
  }
  cuda::DeviceGuard guard(options.device);
  if (!guard.ok()) return Status::internal("cudaSetDevice failed");
  const size_t cap =
      options.max_dequant_bytes ? options.max_dequant_bytes : cuda::kDefaultDequantBytes;
  auto layer = std::make_unique<cuda::CudaLayer>(spec, options, cap);
  const cuda::GemmChoice gemm = cuda::gemm_choice(options.gemm);
  int sm_count = 0;
  QMOE_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, options.device));
  layer->set_cutlass(gemm != cuda::GemmChoice::kMma, gemm == cuda::GemmChoice::kCutlass, sm_count);
  QMOE_RETURN_IF_ERROR(layer->init(weights));
  layer->set_forced(options.dispatch);
  QMOE_RETURN_IF_ERROR(layer->load_dispatch(options.tune_file));
  *out = std::move(layer);
  return Status::ok();
}

}  // namespace qmoe

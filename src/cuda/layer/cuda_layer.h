// The CUDA backend's prepared layer, in three files besides this one:
//
//   cuda_layer.h         CudaLayer: what prepare keeps (device copies of the weights, the decode
//                        path's packed copies, the dispatch table, the settings) and the methods
//                        the other files define
//   layer_workspace.cu   layout(): where each buffer of a call lives in the caller's workspace,
//                        the exact workspace_size() formula (docs/cuda-backend.md, Workspace)
//   layer_prepare.cu     prepare_cuda_layer(): checks, uploads, the mixed-input copies, the decode
//                        path's packing and the fused kernel's plan, the dispatch table (once, at
//                        prepare)
//   layer_run.cu         run(): the fused kernel (routing to combine in one launch), or routing
//                        -> plan -> the decode path (FC1 + activation, FC2 by the decode
//                        kernels) or the generic path (gather, per wave: dequantize the wave's
//                        experts into the scratch, grouped GEMM [FC1, FC3] -> activation -> per
//                        wave [FC2]) -> finalize (the combine); take_deferred_error()
//
// Local experts (LayerSpec::first_expert, local_experts): the weights hold L of the E experts.
// Routing and the maps cover all E; the plan and every FC kernel see the held experts only, by
// local index (counts and offsets from entry first_expert on), and the combine skips the other
// shards' slots in slot order, as the CPU backend does.
//
// Every buffer of a call lives in the caller's workspace; every launch goes to the caller's
// stream; nothing waits for the device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/act_quant.h"
#include "core/formats/mma_pack.h"
#include "cuda/common/device_buffer.h"
#include "cuda/dequant/dequant.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/gemm/cutlass_fp8.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/layer/dispatch.h"
#include "cuda/layer/stages.h"
#include "cuda/prepare/uploader.h"
#include "cuda/routing/device_routing.h"
#include "qmoe/backend.h"
#include "qmoe/tuning.h"

namespace qmoe::cuda {

inline constexpr size_t kAlign = 256;
inline constexpr size_t kDefaultDequantBytes = size_t{1} << 30;

inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
inline int64_t pad_k(int64_t k) { return (k + kGemmKAlign - 1) / kGemmKAlign * kGemmKAlign; }
// The FP8 path's K width (act_quant): k in whole 128-column groups, the FP8 GEMM's K scale block
// and the activations' quantization group alike.
static_assert(kFp8ScaleBlock == kActQuantGroup, "one 128-column group for weights and rows");
inline int64_t pad_fp8_k(int64_t k) {
  return (k + kFp8ScaleBlock - 1) / kFp8ScaleBlock * kFp8ScaleBlock;
}

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

// The generic path's GEMM (PrepareOptions::gemm): CUTLASS's mixed-input kernel on the packed codes
// where an FC allows it, else dequantize + CUTLASS; dequantize + CUTLASS always; or dequantize +
// the mma.sync kernel.
enum class GemmChoice { kCutlass, kCutlassDequant, kMma };

// An FC's copy for the mixed-input GEMM (cutlass_mixed.h): the codes of its kind (int4's signed
// copy, ORT's u8 / e4m3 codes, or MXFP4's e4m3 copy), scales [E, k / chunk, n] and zeros. Absent
// (codes null) where the FC runs through the dequantize pass.
struct MixedFc {
  MixedCodes kind = MixedCodes::kNone;
  const uint8_t* codes = nullptr;
  const void* scales = nullptr;
  const float* zeros = nullptr;  // kinds with a zero term
  int64_t chunk = 0;
  // The automatic tile's middle-tile bound (mixed_tile_for, dispatch.h): fp8's kE4m3 has none.
  int64_t mid_routes = kMixedMidRoutes;
  bool on() const { return codes != nullptr; }
};

// An FC's copy for the FP8 grouped GEMM (act_quant, cutlass_fp8.h): e4m3 codes [E, n, k] and f32
// scales, ORT's codes with block scales [E, ceil(n / 128), k / 128] (fp8, fp8_block), or MXFP4's
// exact e4m3 copy with row scales [E, n, k / 128] (core/formats/fp4_e4m3.h; k is K rounded up to
// 128, the codes past K zero).
struct Fp8Fc {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t n = 0, k = 0;
  bool row_scales = false;
  int64_t scale_rows() const { return fp8_weight_scale_rows(n, row_scales); }  // per expert
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
        fused_grid_ctas_(options.fused_grid_ctas),
        mixed_tile_(options.mixed_tile),
        epilogue_act_(options.epilogue_act),
        act_fp8_(options.act_quant == "fp8_e4m3") {
    cdt_ = spec.act_dtype;
    cs_ = dtype_size(cdt_);
    hp_ = pad_k(spec.hidden);
    ip_ = pad_k(spec.inter);
    hq_ = pad_fp8_k(spec.hidden);
    iq_ = pad_fp8_k(spec.inter);
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
    return names_of(
        cuda::dispatch_candidates(decode_ready_, tokens, fused_max_tokens_, layer_tiles()));
  }
  Status force_dispatch(const std::string& choice) override {
    QMOE_RETURN_IF_ERROR(check_forced_choice(
        choice, names_of(layer_choices(decode_ready_, fused_max_tokens_, layer_tiles()))));
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
  // Byte offsets of one call's buffers in the workspace (layer_workspace.cu: the formula).
  struct Layout {
    size_t maps, touched, n_touched, tile_start, ready, route_temp, route_temp_bytes, xa,
        act_scales, ya, hy, h3, scratch, cutlass, mixed, mixed2, fused, total;
    int64_t slots_in_scratch, waves;
  };

  Status layout(int64_t t, Layout* l) const;

  // codes: upload the codes and scales in ORT's layout (FP4 and FP8 that the decode path packs
  // keep only the packed copy, unless the mixed-input GEMM reads the codes as they are).
  Status upload_fc(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, bool codes,
                   DeviceFc* out);
  // Whether the decode path takes this layer (sets pack1_ and pack2_).
  bool plan_decode();
  Status pack_for_decode(const LayerWeights& w);
  // `maps` is the held experts' view (run()): counts and offsets by local index, the per-route
  // arrays the whole layer's.
  // combine: FC2 runs with the combine into the output (the finalize's terms), and no finalize
  // kernel follows.
  Status run_decode(const RunInputs& in, const Layout& l, char* ws, const RouteMapsView& maps,
                    const CombineTerms* combine, cudaStream_t stream, RunProfile* profile);
  // One FC's GEMM on the generic path: its operands (a [R, lda] in, c [R, ldc] out, ld_b the
  // dequantized weights' row), its mixed-input tile (0 without that copy), act_out (FC1 with the
  // activation in its epilogue: its rows [R, ip_] in the activation dtype there, c unused) and
  // its region of the workspace for the GEMM's group arrays (l.mixed, or l.mixed2 for FC2).
  struct FcCall {
    const DeviceFc* fc = nullptr;
    const MixedFc* mx = nullptr;
    const void* a = nullptr;
    int64_t lda = 0;
    void* c = nullptr;
    int64_t ldc = 0, ld_b = 0;
    int tile = 0;
    void* act_out = nullptr;
    size_t region = 0, region_bytes = 0;
    bool pdl = false;  // its kernels launch with programmatic dependent launch
  };
  // A generic call's FCs in their order (FC1, FC3 where the layer has it, FC2), for `routes`
  // routes and the dispatch choice's tile (0: the layer's, mixed_tile_of). act_epilogue: FC1
  // activates in its epilogue (no activation kernel). pdl: the call's kernels (gather,
  // activation, each FC's) launch with programmatic dependent launch.
  struct GenericCalls {
    FcCall fc1, fc3, fc2;
    bool act_epilogue = false;
    bool pdl = false;
  };
  GenericCalls generic_calls(const Layout& l, char* ws, int64_t routes, int tile, bool pdl) const;
  // The mixed-input GEMM's arguments of a call of an FC with that copy.
  MixedGemmArgs mixed_args(const FcCall& c, const Layout& l, char* ws,
                           const RouteMapsView& maps) const;
  // planned: the routing wrote FC1's and FC2's group arrays and gathered the input (run()).
  Status run_generic(const RunInputs& in, const Layout& l, char* ws, const RouteMapsView& maps,
                     cudaStream_t stream, RunProfile* profile, const GenericCalls& calls,
                     bool planned);
  // The generic path with FP8 activations (layer_fp8.cu): FC1 (+FC3) and FC2 on the FP8 GEMM.
  Status run_generic_fp8(const RunInputs& in, const Layout& l, char* ws, const RouteMapsView& maps,
                         cudaStream_t stream, RunProfile* profile);
  // A generic call's expert schedule (touched experts, their count and offsets; the tile starts
  // for the mma.sync GEMM) and the bound on its groups, min(L, routes).
  GroupSchedule schedule(const Layout& l, char* ws, const RouteMapsView& maps) const {
    GroupSchedule s;
    s.touched = reinterpret_cast<const int32_t*>(ws + l.touched);
    s.n_touched = reinterpret_cast<const int32_t*>(ws + l.n_touched);
    s.offsets = maps.expert_offsets;
    s.tile_start = reinterpret_cast<const int32_t*>(ws + l.tile_start);
    return s;
  }
  int max_groups(const RouteMapsView& maps) const {
    return static_cast<int>(std::min<int64_t>(spec_.weight_experts(), maps.tokens * spec_.slots()));
  }
  // The activation stage's arguments of a generic call (FC1 output h, FC3's h3).
  ActivationArgs activation_args(const RouteMapsView& maps, const void* h, const void* h3) const;
  // act_quant = fp8_e4m3: what the FP8 path needs of the layer (checked before any upload), and
  // an FC's copy (codes as uploaded, block scales in f32).
  Status check_fp8_support() const;
  // Every FC's FP8 copy; a separate FC3 without biases joins FC1 as one [2I, H] FC (gate rows,
  // then linear rows), so that one GEMM runs both, where both parts take the same scale form.
  Status prepare_fp8(const LayerWeights& w);
  // One FC's FP8 copy: ORT's codes and block scales (fp8, fp8_block), or MXFP4's exact e4m3
  // copy (prepare_fp8_mxfp4), K padded to kq.
  Status fp8_part(const FcFormat& f, const FcWeights& w, DeviceFc* fc, int64_t kq, Fp8Fc* out);
  // MXFP4's e4m3 copy with row scales, from the uploaded K-packed codes (which it frees), e8m0
  // and global scales; an FC with a chunk that does not convert exactly is refused.
  Status prepare_fp8_mxfp4(DeviceFc* fc, int64_t kq, Fp8Fc* out);
  // The f32 block scales [E, ceil(n / 128), k / 128] of one FC, built on the host.
  std::vector<float> fp8_block_scales(const FcFormat& f, const FcWeights& w, int64_t n,
                                      int64_t k) const;
  Status run_fc_fp8(const Fp8Fc& f8, const Layout& l, char* ws, const RouteMapsView& maps,
                    const uint8_t* a, const float* a_scales, int64_t lda, uint16_t* c, int64_t ldc,
                    cudaStream_t stream);
  // The whole call in the fused kernel.
  // With a profile, the kernel's stamps (fused_decode.h) give the stages: route (the slowest
  // CTA's routing), fc1 (the busiest CTA's FC1 items), fc2 (its FC2 items, their wait for FC1
  // included) and combine (from the last CTA's items to the end: the grid barrier's wait and the
  // combine).
  Status run_fused(const RunInputs& in, const MutableTensorView& out, const Layout& l, char* ws,
                   int64_t tokens, cudaStream_t stream, RunProfile* profile);
  // Whether the fused kernel takes this layer (after pack_for_decode), and up to what count.
  Status plan_fused();
  Status upload(const TensorView& v, const void** dst);
  // A device buffer of `bytes` the layer keeps (filled by the caller, e.g. a packing kernel).
  Status keep(size_t bytes, void** dst);
  // Frees a buffer keep() gave (the device must be done with it).
  void release(const void* p);
  // The element of an FC's output rows on the generic path: the mixed-input GEMM's
  // (mixed_out_dtype) where the FC has that copy, else fp32 (the dequantize path's GEMMs).
  DType fc_out_dtype(const MixedFc& mx) const {
    return mx.on() ? mixed_out_dtype(cdt_) : DType::kF32;
  }
  // One FC (c's rows are fc_out_dtype(mx)): the mixed-input GEMM, without its setup kernel where
  // setup_written (the routing wrote its group arrays), or the dequantize path's waves.
  Status run_fc(const FcCall& c, const Layout& l, char* ws, const RouteMapsView& maps,
                cudaStream_t stream, bool setup_written = false);
  // The mixed-input copy of one FC, where the GEMM choice and the FC allow it.
  // `fc` is the FC as uploaded (its shape, and ORT's codes where they were uploaded); int4 codes
  // become the signed copy in place (fc->weight then null: the mixed copy is their only reader).
  // glu: FC1's rows in the activation epilogue's order (cutlass_mixed.h's GluRows).
  Status prepare_mixed(const FcFormat& f, const FcWeights& w, DeviceFc* fc, MixedFc* out,
                       GluRows glu = GluRows::kNone);
  // The decode path's codes of fc1_ or fc2_ where they are the mixed copy of kind c (rows in glu's
  // order) word for word, else null (layer_prepare.cu).
  const uint32_t* decode_copy_of(const DeviceFc* fc, MixedCodes c, GluRows glu) const;
  // MXFP4's copy (e4m3 codes, exact, or none); f: the FC's format as ORT gives it (its FP4
  // layout), scales: the staged e8m0 scales.
  Status prepare_mixed_e4m3(const FcFormat& f, const FcWeights& w, const uint8_t* scales,
                            DeviceFc* fc, MixedFc* out);
  // The row order FC1's mixed-input copy of kind fc1_kind takes: GluRows bands where the
  // activation epilogue or the decode path's shared codes need them, else kNone (ORT's order).
  GluRows fc1_band_rows(MixedCodes fc1_kind) const;
  // Whether a banded FC1 of this kind may activate in its GEMM's epilogue
  // (PrepareOptions::epilogue_act, the kind's narrow tile, no FC1 bias, the routing weight after
  // FC2).
  bool act_epilogue_fits(MixedCodes fc1_kind) const;
  // The mixed-input GEMM's tile (its N) for an FC of this copy in a call of `routes` routes:
  // `tile` where the call's dispatch choice names one, else PrepareOptions::mixed_tile, else
  // mixed_tile_for; the copy's 128-row tile where its kind lacks that one.
  int mixed_tile_of(const MixedFc& mx, int64_t routes, int tile = 0) const;
  // The tiles a generic choice may name on this layer (dispatch.h): those some FC's mixed-input
  // copy has, where there are at least two; none without mixed-input copies or with FP8
  // activations (the FP8 GEMM keeps its own rule).
  std::vector<int> layer_tiles() const;
  bool all_mixed() const {
    return mixed1_.on() && mixed2_.on() && (!spec_.has_fc3() || mixed3_.on());
  }
  // How the generic path runs this layer, for the dispatch table's window (dispatch.h).
  GenericKind generic_kind() const;

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
  // The FP8 path's K widths (act_quant): hidden and inter rounded up to its 128-column groups.
  int64_t hq_, iq_;
  DeviceFc fc1_, fc2_, fc3_;
  // The decode path's copies of FC1 and FC2 in the tensor-core fragment layout (mma_pack.h),
  // present when both FCs are formats that layout supports (plan_decode).
  bool decode_planned_ = false, decode_ready_ = false;
  // Decode calls of up to this many tokens run FC2 with the combine (no finalize kernel); 0 none
  // (DecodeOptions::combine, where FC2's shape and the slots fit it).
  int combine_tokens_ = 0;
  // The fused kernel's part of every call's arguments (weights, routing spec, shapes) and its
  // launch per token count, [0, F] (entry 0 unused): derived once, at plan_fused().
  FusedDecodeArgs fused_args_;
  std::vector<FusedLaunch> fused_plans_;
  int64_t fused_max_tokens_ = 0;  // 0: the fused kernel does not take this layer
  int fused_grid_ctas_ = 0;       // PrepareOptions::fused_grid_ctas (0: as many as fit)
  DeviceBuffer fused_stamps_;     // profiled calls only (they take turns: profile_mu_)
  std::vector<size_t> fused_ws_;  // [0, F]: the layout's fused entry by token count
  DispatchTable dispatch_;
  bool cutlass_ = false;      // set_cutlass()
  bool mixed_ = false;        // set_cutlass()
  int mixed_tile_ = 0;        // PrepareOptions::mixed_tile
  bool epilogue_act_ = true;  // PrepareOptions::epilogue_act
  // FC1's mixed copy is in GluRows order: the activation kernel reads FC1's banded columns, or
  // (act_epilogue_) calls on a tile with the epilogue form activate in FC1's epilogue.
  bool act_rows_ = false;
  bool act_epilogue_ = false;
  MixedFc mixed1_, mixed2_, mixed3_;
  bool act_fp8_ = false;  // PrepareOptions::act_quant == "fp8_e4m3"
  Fp8Fc fp8_1_, fp8_2_, fp8_3_;
  bool fp8_joined_ = false;  // FC3 joined FC1 (fp8_1_ holds both; fp8_3_ unused)
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
  // Prepare's copies to the device (init() only; released when it returns).
  std::unique_ptr<Uploader> uploader_;
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

}  // namespace qmoe::cuda

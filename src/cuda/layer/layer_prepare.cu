// Prepare (cuda_layer.h): the checks, the weights uploaded or packed once, the dispatch table.
#include <cuda_runtime.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/formats/mma_pack.h"
#include "cuda/common/cuda_check.h"
#include "cuda/cuda_backend.h"
#include "cuda/decode/decode_gemv.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/cuda_layer.h"
#include "qmoe/quantize.h"

namespace qmoe {
namespace cuda {

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
    fp4_repack(Fp4Layout::kNPacked, src.data(), spec_.weight_experts(), n, k, dst.data());
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
  QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc1, w.fc1, fc1_, &mixed1_));
  QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc2, w.fc2, fc2_, &mixed2_));
  if (spec_.has_fc3()) QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc3, w.fc3, fc3_, &mixed3_));
  const int32_t clear[4] = {0, INT32_MAX, 0, INT32_MAX};
  QMOE_RETURN_IF_ERROR(error_.upload(clear, sizeof(clear)));
  QMOE_RETURN_IF_ERROR(plan_fused());  // after error_: its arguments hold the record
  for (cudaEvent_t& e : events_) QMOE_CUDA_TRY(cudaEventCreate(&e));
  QMOE_CUDA_TRY(cudaStreamCreateWithFlags(&take_stream_, cudaStreamNonBlocking));
  return Status::ok();
}

// The mixed-input GEMM's copy of one FC (cutlass_mixed.h), built on the host once: transposed
// scales (and zeros) always; int4's signed codes beside ORT's; u8 and e4m3 codes are ORT's own,
// shared with the uploaded raw copy where there is one (FP8 under the decode path has none).
Status CudaLayer::prepare_mixed(const FcFormat& f, const FcWeights& w, const DeviceFc& raw,
                                MixedFc* out) {
  *out = MixedFc{};
  const MixedCodes c = mixed_ ? mixed_codes_for(f, cdt_, raw.n, raw.k) : MixedCodes::kNone;
  if (c == MixedCodes::kNone) return Status::ok();
  auto to_host = [](const TensorView& v, std::vector<uint8_t>* h) -> Status {
    h->resize(v.present() ? v.bytes() : 0);
    if (!h->empty()) QMOE_CUDA_TRY(cudaMemcpy(h->data(), v.data, h->size(), cudaMemcpyDefault));
    return Status::ok();
  };
  std::vector<uint8_t> codes, scales, zero_points, global;
  const bool own_codes = c == MixedCodes::kInt4 || c == MixedCodes::kInt4Zero;
  if (own_codes) QMOE_RETURN_IF_ERROR(to_host(w.weight, &codes));
  QMOE_RETURN_IF_ERROR(to_host(w.scales, &scales));
  QMOE_RETURN_IF_ERROR(to_host(w.zero_points, &zero_points));
  QMOE_RETURN_IF_ERROR(to_host(w.global_scale, &global));
  MixedCopy copy;
  mixed_prepare(c, f, cdt_, spec_.weight_experts(), raw.n, raw.k, codes.data(), scales.data(),
                zero_points.data(), reinterpret_cast<const float*>(global.data()), &copy);
  auto bytes = [](const void* p, size_t n) {
    return TensorView(p, DType::kU8, {static_cast<int64_t>(n)});
  };
  const void* p = nullptr;
  if (own_codes) {
    QMOE_RETURN_IF_ERROR(upload(bytes(copy.codes.data(), copy.codes.size()), &p));
  } else if (raw.weight != nullptr) {
    p = raw.weight;
  } else {
    QMOE_RETURN_IF_ERROR(upload(w.weight, &p));
  }
  out->codes = static_cast<const uint8_t*>(p);
  QMOE_RETURN_IF_ERROR(upload(bytes(copy.scales.data(), copy.scales.size()), &p));
  out->scales = p;
  if (!copy.zeros.empty()) {
    QMOE_RETURN_IF_ERROR(upload(bytes(copy.zeros.data(), 4 * copy.zeros.size()), &p));
    out->zeros = static_cast<const float*>(p);
  }
  out->chunk = copy.chunk;
  out->kind = c;
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
  const int64_t E = spec_.weight_experts();  // the experts the weight tensors hold
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
  f.local_experts = static_cast<int>(spec_.weight_experts());
  f.slots = spec_.slots();
  f.hidden = spec_.hidden;
  f.inter = spec_.inter;
  if (!fused_decode_supports(f, cdt_)) return Status::ok();
  QMOE_RETURN_IF_ERROR(prepare_fused_decode());
  fused_plans_.assign(static_cast<size_t>(kFusedDecodeMaxTokens) + 1, FusedLaunch{});
  fused_ws_.assign(static_cast<size_t>(kFusedDecodeMaxTokens) + 1, 0);
  for (int t = 1; t <= kFusedDecodeMaxTokens; ++t) {
    QMOE_RETURN_IF_ERROR(plan_fused_decode(f, cdt_, t, fused_grid_ctas_, &fused_plans_[t]));
    fused_ws_[t] = std::max(fused_ws_[t - 1], fused_decode_workspace_bytes(f, t));
  }
  FusedDecodeArgs& a = fused_args_;
  a.routing = spec_.routing;
  a.experts = f.experts;
  a.first_expert = static_cast<int>(spec_.first_expert);
  a.local_experts = static_cast<int>(spec_.weight_experts());
  a.slots = f.slots;
  a.router_bias = router_bias_;
  auto fc = [](const MmaPackShape& shape, const uint32_t* packed, const uint8_t* scales,
               DType scale_dtype, const uint8_t* zp, const DeviceFc& d) {
    FusedFc out;
    out.shape = shape;
    out.packed = packed;
    out.scales = scales;
    out.scale_dtype = scale_dtype;
    out.zero_points = zp;
    out.bias = d.bias;
    out.bias_dtype = d.bias_dtype;
    return out;
  };
  a.fc1 = fc(pack1_, packed1_, tiled_scales1_, spec_.fc1.scale_dtype, tiled_zp1_, fc1_);
  a.fc2 = fc(pack2_, packed2_, tiled_scales2_, spec_.fc2.scale_dtype, tiled_zp2_, fc2_);
  a.dtype = cdt_;
  a.act = spec_.activation;
  a.scale_input = spec_.routing.combine == CombineMode::kScaleInput;
  a.hidden = spec_.hidden;
  a.inter = spec_.inter;
  a.error = error_.as<int32_t>();
  fused_max_tokens_ = kFusedDecodeMaxTokens;
  return Status::ok();
}

Status CudaLayer::load_dispatch(const std::string& tune_file) {
  // The analytic window compares the mean routes per expert, T slots / E, with a cap. A shard's
  // held experts get the same mean (about T slots L / E routes over L experts), so E stays; its
  // tune rows are its own (tune_key names the local experts).
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

namespace {

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

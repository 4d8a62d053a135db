// Prepare (cuda_layer.h): the checks, the weights uploaded or packed once, the dispatch table.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/formats/mma_pack.h"
#include "cuda/common/cuda_check.h"
#include "cuda/cuda_backend.h"
#include "cuda/decode/decode_gemv.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/cuda_layer.h"
#include "cuda/prepare/device_pack.h"
#include "qmoe/quantize.h"

namespace qmoe {
namespace cuda {

Status CudaLayer::upload(const TensorView& v, const void** dst) {
  *dst = nullptr;
  if (!v.present()) return Status::ok();
  if (uploader_ == nullptr) return Status::internal("CudaLayer::upload outside init()");
  void* p = nullptr;
  QMOE_RETURN_IF_ERROR(keep(v.bytes(), &p));
  QMOE_RETURN_IF_ERROR(uploader_->copy(p, v.data, v.bytes(), "a weight tensor"));
  *dst = p;
  return Status::ok();
}

Status CudaLayer::keep(size_t bytes, void** dst) {
  DeviceBuffer b;
  QMOE_RETURN_IF_ERROR(b.allocate(bytes));
  *dst = b.get();
  buffers_.push_back(std::move(b));
  return Status::ok();
}

void CudaLayer::release(const void* p) {
  buffers_.erase(std::remove_if(buffers_.begin(), buffers_.end(),
                                [p](const DeviceBuffer& b) { return b.get() == p; }),
                 buffers_.end());
}

namespace {

// The device copy of an ORT tensor that a packing kernel reads: `kept` where prepare uploaded the
// tensor already, else a temporary upload into *tmp (null for an absent tensor).
Status stage(Uploader& up, const TensorView& v, const void* kept, DeviceBuffer* tmp,
             const uint8_t** out) {
  *out = static_cast<const uint8_t*>(kept);
  if (kept != nullptr || !v.present()) return Status::ok();
  QMOE_RETURN_IF_ERROR(tmp->allocate(v.bytes()));
  QMOE_RETURN_IF_ERROR(up.copy(tmp->get(), v.data, v.bytes(), "a weight tensor"));
  *out = tmp->as<uint8_t>();
  return Status::ok();
}

// Prepare's packing kernels run on the legacy default stream, ordered with its synchronous
// copies; a temporary buffer is freed (cudaFree waits for the device) only after its readers.
constexpr cudaStream_t kPrepareStream = 0;

// K-packed FP4 codes [E, n, k / 2] that a packing kernel reads: `kept` (init's upload, K-packed
// already) where there is one, else a temporary upload into *tmp, K-packed into *repacked where
// ORT's layout (f.fp4_layout) is N-packed.
Status stage_k_packed(Uploader& up, const FcFormat& f, const TensorView& v, const void* kept,
                      int64_t experts, int64_t n, int64_t k, DeviceBuffer* tmp,
                      DeviceBuffer* repacked, const uint8_t** out) {
  QMOE_RETURN_IF_ERROR(stage(up, v, kept, tmp, out));
  if (kept != nullptr || f.fp4_layout != Fp4Layout::kNPacked) return Status::ok();
  QMOE_RETURN_IF_ERROR(repacked->allocate(v.bytes()));
  QMOE_RETURN_IF_ERROR(
      device_fp4_k_packed(*out, experts, n, k, repacked->as<uint8_t>(), kPrepareStream));
  *out = repacked->as<uint8_t>();
  return Status::ok();
}

// Runs `convert`, a conversion that raises a device flag (int32, cleared first) where a value does
// not convert exactly, on kPrepareStream and says in *raised whether it did: the read back
// (a synchronous copy on the same stream) waits for the conversion.
template <typename Convert>
Status convert_flagged(Convert&& convert, bool* raised) {
  DeviceBuffer flag;
  QMOE_RETURN_IF_ERROR(flag.allocate(sizeof(int32_t)));
  QMOE_CUDA_TRY(cudaMemsetAsync(flag.get(), 0, sizeof(int32_t), kPrepareStream));
  QMOE_RETURN_IF_ERROR(convert(flag.as<int32_t>()));
  int32_t v = 0;
  QMOE_CUDA_TRY(cudaMemcpy(&v, flag.get(), sizeof(int32_t), cudaMemcpyDeviceToHost));
  *raised = v != 0;
  return Status::ok();
}

}  // namespace

Status CudaLayer::upload_fc(const FcFormat& f, const FcWeights& w, int64_t n, int64_t k, bool codes,
                            DeviceFc* out) {
  out->format = f;
  out->n = n;
  out->k = k;
  const void* p = nullptr;
  if (!codes) {  // the codes and scales live in the packed copy only
    out->format.fp4_layout = Fp4Layout::kKPacked;
  } else if (f.info().kind == FormatKind::kFp4 && f.fp4_layout == Fp4Layout::kNPacked) {
    // The kernels read K-packed rows; repack ORT's N-packed layout once, exactly, on the device.
    DeviceBuffer staged;
    const uint8_t* src = nullptr;
    QMOE_RETURN_IF_ERROR(stage(*uploader_, w.weight, nullptr, &staged, &src));
    void* dst = nullptr;
    QMOE_RETURN_IF_ERROR(keep(w.weight.bytes(), &dst));
    QMOE_RETURN_IF_ERROR(device_fp4_k_packed(src, spec_.weight_experts(), n, k,
                                             static_cast<uint8_t*>(dst), kPrepareStream));
    p = dst;
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
  // Up to 4 copy workers: a memcpy thread moves about 10 GB/s, and a PCIe 5 link about 50.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  uploader_ = std::make_unique<Uploader>(static_cast<int>(std::min(4u, cores)));
  // FP4 and FP8 FCs the decode path packs keep only that copy (pack_for_decode), except the codes
  // the mixed-input GEMM reads as ORT stores them (fp8's e4m3): those are uploaded once and
  // shared. (MXFP4's e4m3 copy is built from a temporary upload, prepare_mixed.)
  if (act_fp8_) QMOE_RETURN_IF_ERROR(check_fp8_support());
  decode_planned_ = plan_decode();
  // FC2 with the combine (DecodeFcArgs::combine) on calls of up to combine_tokens_ tokens.
  const int combine = decode_options_.combine < 0 ? kDecodeCombineTokens : decode_options_.combine;
  combine_tokens_ =
      decode_planned_ && decode_combine_fits(pack2_, spec_.fc2.zero_points, spec_.slots()) ? combine
                                                                                           : 0;
  // The FP8 GEMM reads ORT's e4m3 codes as they are, as the mixed-input kernel does.
  auto raw = [&](const FcFormat& f, int64_t n, int64_t k) {
    const FormatKind kind = f.info().kind;
    return !decode_planned_ || (kind != FormatKind::kFp4 && kind != FormatKind::kFp8) || act_fp8_ ||
           (mixed_ && kind == FormatKind::kFp8 &&
            mixed_codes_for(f, cdt_, n, k) == MixedCodes::kE4m3);
  };
  // A separate FC3 the decode path takes lives in FC1's packed copy (plan_decode).
  const int64_t H = spec_.hidden, I = spec_.inter;
  QMOE_RETURN_IF_ERROR(
      upload_fc(spec_.fc1, w.fc1, spec_.fc1_rows(), H, raw(spec_.fc1, spec_.fc1_rows(), H), &fc1_));
  QMOE_RETURN_IF_ERROR(upload_fc(spec_.fc2, w.fc2, H, I, raw(spec_.fc2, H, I), &fc2_));
  if (spec_.has_fc3()) {
    QMOE_RETURN_IF_ERROR(upload_fc(spec_.fc3, w.fc3, I, H, raw(spec_.fc3, I, H), &fc3_));
  }
  const void* p = nullptr;
  if (spec_.routing.method == RoutingMethod::kGroupedTopK) {
    QMOE_RETURN_IF_ERROR(upload(w.router_bias, &p));
    router_bias_ = static_cast<const float*>(p);
  }
  QMOE_RETURN_IF_ERROR(pack_for_decode(w));
  if (act_fp8_) {  // every FC on the FP8 GEMM: no mixed-input copies
    QMOE_RETURN_IF_ERROR(prepare_fp8(w));
  } else {
    const MixedCodes kind1 =
        mixed_ ? mixed_codes_for(spec_.fc1, cdt_, fc1_.n, fc1_.k) : MixedCodes::kNone;
    const GluRows glu = fc1_band_rows(kind1);
    QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc1, w.fc1, &fc1_, &mixed1_, glu));
    act_rows_ = glu != GluRows::kNone && mixed1_.on();
    act_epilogue_ = act_rows_ && act_epilogue_fits(kind1);
    QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc2, w.fc2, &fc2_, &mixed2_));
    if (spec_.has_fc3()) QMOE_RETURN_IF_ERROR(prepare_mixed(spec_.fc3, w.fc3, &fc3_, &mixed3_));
  }
  const int32_t clear[4] = {0, INT32_MAX, 0, INT32_MAX};
  QMOE_RETURN_IF_ERROR(error_.upload(clear, sizeof(clear)));
  uploader_.reset();                   // its pinned chunks
  QMOE_RETURN_IF_ERROR(plan_fused());  // after error_: its arguments hold the record
  // Prepare's copies and kernels ran on the legacy default stream, and a copy from pageable host
  // memory may return before the device has done it: the layer is ready once they all are, since
  // the caller's stream (non-blocking, say) need not wait for that stream.
  QMOE_CUDA_TRY(cudaStreamSynchronize(kPrepareStream));
  for (cudaEvent_t& e : events_) QMOE_CUDA_TRY(cudaEventCreate(&e));
  QMOE_CUDA_TRY(cudaStreamCreateWithFlags(&take_stream_, cudaStreamNonBlocking));
  return Status::ok();
}

// FC1's mixed-input copy takes the band order of GluRows (cutlass_mixed.h) where a reader needs
// it and the activation kernel can read it (a gated activation of FC1's own rows, no padded I;
// an FC1 bias keeps ORT's order, read by channel): where the activation may run in FC1's
// epilogue (act_epilogue_fits), and where the decode path's codes, banded alike, then serve as
// the copy (decode_copy_of: one copy for both paths). Elsewhere FC1 keeps ORT's row order.
GluRows CudaLayer::fc1_band_rows(MixedCodes fc1_kind) const {
  const ActivationSpec& a = spec_.activation;
  if (fc1_kind == MixedCodes::kNone || !mixed_codes_shuffled(fc1_kind) || !a.gated() ||
      a.glu == GluLayout::kSeparateFc3 || spec_.has_fc3() || ip_ != spec_.inter) {
    return GluRows::kNone;
  }
  const GluRows g =
      a.glu == GluLayout::kInterleaved ? GluRows::kInterleaved : GluRows::kConcatenated;
  return act_epilogue_fits(fc1_kind) || decode_copy_of(&fc1_, fc1_kind, g) != nullptr
             ? g
             : GluRows::kNone;
}

// Whether FC1's activation may move into its mixed-input GEMM's epilogue (cutlass_act_epilogue.cuh)
// on a banded FC1: the epilogue computes what the activation kernel would from FC1's rows alone
// (no FC1 bias) when the routing weight is applied after FC2, for a kind and dtype with the
// epilogue form (the narrow tile's; calls on other tiles run the activation kernel on the banded
// columns).
bool CudaLayer::act_epilogue_fits(MixedCodes fc1_kind) const {
  return epilogue_act_ && mixed_has_act_epilogue(fc1_kind, cdt_, 32) && fc1_.bias == nullptr &&
         spec_.routing.combine != CombineMode::kScaleInput;
}

// The decode path's packed codes of *fc where they are, word for word, the shuffled copy the
// mixed-input GEMM of kind c reads with rows in `glu`'s order, else null. int4 and int8 pack
// step-major (mma_pack.h), which is the shuffled order; they agree where the packing has no
// padding (16-row tiles and whole chunks: n a multiple of 16, K of 64 or 32) and both order the
// rows alike: FC2 and ungated FC1s as they are, a gated FC1 in bands of 8 gates and their 8
// linear rows (the decode map and GluRows, fc1_band_rows). Elsewhere (FC1 in ORT's order, an
// FC3) each path keeps a copy of its own.
const uint32_t* CudaLayer::decode_copy_of(const DeviceFc* fc, MixedCodes c, GluRows glu) const {
  if (!decode_ready_ || !mixed_codes_shuffled(c) || (fc != &fc1_ && fc != &fc2_)) return nullptr;
  const MmaPackShape& s = fc == &fc1_ ? pack1_ : pack2_;
  const uint32_t* words = fc == &fc1_ ? packed1_ : packed2_;
  if (!mma_step_major(s.codes, s.bits) || s.bits != mixed_code_bits(c)) return nullptr;
  if (s.tiles * 16 != fc->n || s.chunks * 16 * s.steps_per_chunk != fc->k) return nullptr;
  const bool rows_alike = (s.map == MmaRowMap::kIdentity && glu == GluRows::kNone) ||
                          (s.map == MmaRowMap::kGatedInterleaved && glu == GluRows::kInterleaved) ||
                          (s.map == MmaRowMap::kGatedConcatenated && glu == GluRows::kConcatenated);
  return rows_alike ? words : nullptr;
}

// The mixed-input GEMM's copy of one FC (cutlass_mixed.h), built on the device from ORT's tensors
// (device_pack.h): transposed scales (and zeros) always; the shuffled kinds' signed codes in
// place of ORT's (the decode path's words, or shuffled into a buffer of their own; ORT's freed);
// e4m3 codes are ORT's own, those of the raw copy (init uploads every one of them).
Status CudaLayer::prepare_mixed(const FcFormat& f, const FcWeights& w, DeviceFc* fc, MixedFc* out,
                                GluRows glu) {
  const DeviceFc& raw = *fc;
  *out = MixedFc{};
  const MixedCodes c = mixed_ ? mixed_codes_for(f, cdt_, raw.n, raw.k) : MixedCodes::kNone;
  if (c == MixedCodes::kNone) return Status::ok();
  if (glu != GluRows::kNone && !mixed_codes_shuffled(c)) {
    return Status::internal("prepare_mixed: GluRows order needs a shuffled kind");
  }
  const int64_t E = spec_.weight_experts();
  DeviceBuffer staged[1];
  const uint8_t* scales = nullptr;
  QMOE_RETURN_IF_ERROR(stage(*uploader_, w.scales, raw.scales, &staged[0], &scales));
  if (f.format == WeightFormat::kMxFp4) return prepare_mixed_e4m3(f, w, scales, fc, out);
  // The shuffled (integer) kinds' signed copy takes the place of ORT's codes (kE4m3 reads those
  // as they are).
  const bool signed_copy = mixed_codes_shuffled(c);
  if (signed_copy && raw.weight != nullptr) {
    // run_fc never dequantizes an FC that has a mixed copy, and the decode path has packed its
    // own (pack_for_decode ran first): ORT's codes go, and the FC no longer has them.
    const uint8_t* ort_codes = raw.weight;
    fc->weight = nullptr;
    if (const uint32_t* same = decode_copy_of(fc, c, glu)) {  // one copy for both paths
      out->codes = reinterpret_cast<const uint8_t*>(same);
    } else {  // signed and shuffled in one pass, into its own buffer
      void* shuffled = nullptr;
      QMOE_RETURN_IF_ERROR(keep(w.weight.bytes(), &shuffled));
      QMOE_RETURN_IF_ERROR(mixed_shuffle_codes(ort_codes, static_cast<uint8_t*>(shuffled), E, raw.n,
                                               raw.k, mixed_code_bits(c), /*flip=*/true,
                                               kPrepareStream, glu, spec_.inter));
      QMOE_CUDA_TRY(cudaStreamSynchronize(kPrepareStream));
      out->codes = static_cast<const uint8_t*>(shuffled);
    }
    release(ort_codes);
  } else if (!signed_copy && raw.weight != nullptr) {
    out->codes = raw.weight;
  } else {
    return Status::internal("prepare_mixed: the " + std::string(mixed_codes_name(c)) +
                            " codes were not uploaded");
  }
  const int64_t chunk = mixed_chunk(f, raw.k);
  const size_t entries = static_cast<size_t>(E * (raw.k / chunk) * raw.n);
  void* scales_out = nullptr;
  QMOE_RETURN_IF_ERROR(keep(entries * static_cast<size_t>(mixed_scale_bytes(c)), &scales_out));
  out->scales = scales_out;
  float* zeros = nullptr;
  if (mixed_has_zeros(c)) {
    void* p = nullptr;
    QMOE_RETURN_IF_ERROR(keep(entries * sizeof(float), &p));
    zeros = static_cast<float*>(p);
    out->zeros = zeros;
  }
  QMOE_RETURN_IF_ERROR(device_mixed_scales(c, f, cdt_, E, raw.n, raw.k, scales, raw.zero_points,
                                           raw.global_scale, scales_out, zeros, kPrepareStream, glu,
                                           spec_.inter));
  out->chunk = chunk;
  out->kind = c;
  out->mid_routes = c == MixedCodes::kE4m3 ? 0 : kMixedMidRoutes;  // dispatch.h says why
  // The staged tensors are freed on return: the kernels must be done with them.
  QMOE_CUDA_TRY(cudaStreamSynchronize(kPrepareStream));
  return Status::ok();
}

// MXFP4's mixed-input copy: e4m3 codes with f32 scales per 64 K (fp4_e4m3.h), from the K-packed
// codes (stage_k_packed, as the decode path's packing) and the staged e8m0 scales. An FC with a
// chunk that does not convert exactly keeps no copy (the generic path dequantizes it, exactly as
// before); one with the copy drops the raw codes (run_fc never dequantizes it).
Status CudaLayer::prepare_mixed_e4m3(const FcFormat& f, const FcWeights& w, const uint8_t* scales,
                                     DeviceFc* fc, MixedFc* out) {
  const DeviceFc& raw = *fc;
  const int64_t E = spec_.weight_experts(), n = raw.n, k = raw.k;
  if (raw.global_scale == nullptr) {
    return Status::internal("prepare_mixed_e4m3: the global scales were not uploaded");
  }
  DeviceBuffer staged, k_packed;
  const uint8_t* codes = nullptr;
  QMOE_RETURN_IF_ERROR(
      stage_k_packed(*uploader_, f, w.weight, raw.weight, E, n, k, &staged, &k_packed, &codes));
  const int64_t chunk = mixed_chunk(f, k);
  void *e4m3 = nullptr, *s = nullptr;
  QMOE_RETURN_IF_ERROR(keep(static_cast<size_t>(E * n * k), &e4m3));
  QMOE_RETURN_IF_ERROR(keep(static_cast<size_t>(E * (k / chunk) * n) * sizeof(float), &s));
  bool inexact = false;
  QMOE_RETURN_IF_ERROR(convert_flagged(
      [&](int32_t* flag) {
        return device_mxfp4_e4m3(codes, scales, raw.global_scale, E, n, k,
                                 static_cast<uint8_t*>(e4m3), static_cast<float*>(s), flag,
                                 kPrepareStream);
      },
      &inexact));
  if (inexact) {
    release(e4m3);
    release(s);
    return Status::ok();
  }
  if (raw.weight != nullptr) {
    release(raw.weight);
    fc->weight = nullptr;
  }
  out->codes = static_cast<const uint8_t*>(e4m3);
  out->scales = s;
  out->chunk = chunk;
  out->kind = MixedCodes::kE4m3;
  out->mid_routes = kMixedMidRoutes;
  return Status::ok();
}

// MXFP4's copy for the FP8 GEMM (act_quant): e4m3 codes [E, n, kq] with f32 scales per row and
// 128 columns (device_mxfp4_e4m3_rows), from init's upload of the K-packed codes (then freed: the
// decode path has packed its own copy and the generic path reads this one), e8m0 and global
// scales. A chunk that does not convert exactly refuses the layer: FP8 activations run every
// FC on the FP8 GEMM, and the weights stay exact.
Status CudaLayer::prepare_fp8_mxfp4(DeviceFc* fc, int64_t kq, Fp8Fc* out) {
  const int64_t E = spec_.weight_experts(), n = fc->n, k = fc->k;
  if (fc->weight == nullptr || fc->scales == nullptr || fc->global_scale == nullptr) {
    return Status::internal("prepare_fp8_mxfp4: the codes and scales were not uploaded");
  }
  if (fc->format.fp4_layout != Fp4Layout::kKPacked) {  // upload_fc repacks N-packed codes
    return Status::internal("prepare_fp8_mxfp4: expected K-packed codes");
  }
  void *e4m3 = nullptr, *s = nullptr;
  QMOE_RETURN_IF_ERROR(keep(static_cast<size_t>(E * n * kq), &e4m3));
  QMOE_RETURN_IF_ERROR(
      keep(static_cast<size_t>(E * n * (kq / kFp8ScaleBlock)) * sizeof(float), &s));
  bool inexact = false;
  QMOE_RETURN_IF_ERROR(convert_flagged(
      [&](int32_t* flag) {
        return device_mxfp4_e4m3_rows(fc->weight, fc->scales, fc->global_scale, E, n, k, kq,
                                      static_cast<uint8_t*>(e4m3), static_cast<float*>(s), flag,
                                      kPrepareStream);
      },
      &inexact));
  if (inexact) {
    return Status::invalid(
        "act_quant: fp8_e4m3 needs MXFP4 weights whose e4m3 copy is exact: every 128-column "
        "chunk's nonzero codes within 14 binades of its largest block scale, block scale codes "
        "<= 252 and the global scale times 2^(cmax - 133) a normal float (core/formats/"
        "fp4_e4m3.h); an FC of this layer has a chunk that is not");
  }
  release(fc->weight);
  fc->weight = nullptr;
  out->codes = static_cast<const uint8_t*>(e4m3);
  out->scales = static_cast<const float*>(s);
  out->n = n;
  out->k = kq;
  out->row_scales = true;
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
  // Every packed tensor is built on the device (device_pack.h) from ORT's tensors: the uploaded
  // raw copy where there is one, else a temporary upload.
  DeviceBuffer staged[4];
  auto words_of = [&](const MmaPackShape& shape, uint32_t** dst) -> Status {
    void* p = nullptr;
    QMOE_RETURN_IF_ERROR(keep(static_cast<size_t>(E * shape.words_per_expert()) * 4, &p));
    *dst = static_cast<uint32_t*>(p);
    return Status::ok();
  };
  // The tile-ordered scales (elem_bytes each) or zero points (one byte each) of a shape.
  auto tiled_of = [&](const MmaPackShape& shape, int elem_bytes, uint8_t** dst) -> Status {
    void* p = nullptr;
    QMOE_RETURN_IF_ERROR(
        keep(static_cast<size_t>(E * shape.tiles * 16 * shape.scale_blocks * elem_bytes), &p));
    *dst = static_cast<uint8_t*>(p);
    return Status::ok();
  };
  // FP4: K-packed codes (ORT's N-packed layout repacked) and the 8-bit scales in tile order (NVFP4
  // in blocks of 16 over the padded K). The kernels turn the scales into what they apply.
  auto pack_fp4 = [&](const FcFormat& f, const FcWeights& fw, const DeviceFc& raw,
                      const MmaPackShape& shape, uint32_t** packed, uint8_t** scales) -> Status {
    const uint8_t *codes = nullptr, *sc = nullptr;
    QMOE_RETURN_IF_ERROR(stage_k_packed(*uploader_, f, fw.weight, raw.weight, E, shape.n, shape.k,
                                        &staged[0], &staged[1], &codes));
    QMOE_RETURN_IF_ERROR(words_of(shape, packed));
    QMOE_RETURN_IF_ERROR(device_pack_fp4(shape, codes, E, *packed, kPrepareStream));
    QMOE_RETURN_IF_ERROR(stage(*uploader_, fw.scales, raw.scales, &staged[2], &sc));
    const MmaPackShape blocks = mma_fp4_scale_shape(shape);
    QMOE_RETURN_IF_ERROR(tiled_of(blocks, 1, scales));
    QMOE_RETURN_IF_ERROR(device_pack_scales(blocks, sc, 1, E, *scales, kPrepareStream));
    return cuda_status(cudaStreamSynchronize(kPrepareStream), "pack_fp4");
  };
  // FP8: the e4m3 codes; fp8_block's scales per packed row in tile order, fp8 none (its global).
  auto pack_fp8 = [&](const FcFormat& f, const FcWeights& fw, const DeviceFc& raw,
                      const MmaPackShape& shape, uint32_t** packed, uint8_t** scales) -> Status {
    const uint8_t *codes = nullptr, *sc = nullptr;
    QMOE_RETURN_IF_ERROR(stage(*uploader_, fw.weight, raw.weight, &staged[0], &codes));
    QMOE_RETURN_IF_ERROR(words_of(shape, packed));
    QMOE_RETURN_IF_ERROR(device_pack_fp8(shape, codes, nullptr, E, *packed, kPrepareStream));
    *scales = nullptr;
    if (shape.block_size != 0) {
      const int eb = static_cast<int>(dtype_size(f.scale_dtype));
      QMOE_RETURN_IF_ERROR(stage(*uploader_, fw.scales, raw.scales, &staged[2], &sc));
      QMOE_RETURN_IF_ERROR(tiled_of(shape, eb, scales));
      QMOE_RETURN_IF_ERROR(device_pack_scales(shape, sc, eb, E, *scales, kPrepareStream));
    }
    return cuda_status(cudaStreamSynchronize(kPrepareStream), "pack_fp8");
  };
  // FP8 FC1 (gate) and a separate FC3 (linear) as one FC (plan_decode): the codes of both, and
  // each row's scales (fp8_block's block of rows; fp8's global scale, f32) in tile order.
  auto pack_fp8_fc3 = [&](const FcFormat& f, const MmaPackShape& shape, uint32_t** packed,
                          uint8_t** scales) -> Status {
    const bool block = f.format == WeightFormat::kFp8Block;
    const int eb = block ? static_cast<int>(dtype_size(f.scale_dtype)) : 4;
    const uint8_t *gate = nullptr, *lin = nullptr, *src[2] = {nullptr, nullptr};
    QMOE_RETURN_IF_ERROR(stage(*uploader_, w.fc1.weight, fc1_.weight, &staged[0], &gate));
    QMOE_RETURN_IF_ERROR(stage(*uploader_, w.fc3.weight, fc3_.weight, &staged[1], &lin));
    QMOE_RETURN_IF_ERROR(words_of(shape, packed));
    QMOE_RETURN_IF_ERROR(device_pack_fp8(shape, gate, lin, E, *packed, kPrepareStream));
    auto scales_of = [&](const DeviceFc& raw) {
      return block ? static_cast<const void*>(raw.scales) : raw.global_scale;
    };
    QMOE_RETURN_IF_ERROR(stage(*uploader_, block ? w.fc1.scales : w.fc1.global_scale,
                               scales_of(fc1_), &staged[2], &src[0]));
    QMOE_RETURN_IF_ERROR(stage(*uploader_, block ? w.fc3.scales : w.fc3.global_scale,
                               scales_of(fc3_), &staged[3], &src[1]));
    DeviceBuffer rows;
    QMOE_RETURN_IF_ERROR(
        rows.allocate(static_cast<size_t>(E * 2 * shape.units * shape.k_blocks() * eb)));
    QMOE_RETURN_IF_ERROR(device_gated_row_scales(shape, src[0], src[1], eb,
                                                 block ? f.block_size : spec_.inter, E,
                                                 rows.as<uint8_t>(), kPrepareStream));
    QMOE_RETURN_IF_ERROR(tiled_of(shape, eb, scales));
    QMOE_RETURN_IF_ERROR(
        device_pack_scales(shape, rows.as<uint8_t>(), eb, E, *scales, kPrepareStream));
    return cuda_status(cudaStreamSynchronize(kPrepareStream), "pack_fp8_fc3");
  };
  auto pack = [&](const FcFormat& f, const FcWeights& fw, const DeviceFc& raw,
                  const MmaPackShape& shape, uint32_t** packed, uint8_t** scales,
                  uint8_t** zp) -> Status {
    *zp = nullptr;
    if (shape.codes == MmaCodes::kFp8 && &fw == &w.fc1 && spec_.has_fc3()) {
      return pack_fp8_fc3(f, shape, packed, scales);
    }
    if (shape.codes == MmaCodes::kFp8) return pack_fp8(f, fw, raw, shape, packed, scales);
    if (shape.codes != MmaCodes::kInt) return pack_fp4(f, fw, raw, shape, packed, scales);
    // Integer codes, scales and zero points were uploaded raw (init).
    QMOE_RETURN_IF_ERROR(words_of(shape, packed));
    QMOE_RETURN_IF_ERROR(device_pack_int(shape, raw.weight, E, *packed, kPrepareStream));
    const int eb = static_cast<int>(dtype_size(f.scale_dtype));
    QMOE_RETURN_IF_ERROR(tiled_of(shape, eb, scales));
    QMOE_RETURN_IF_ERROR(device_pack_scales(shape, raw.scales, eb, E, *scales, kPrepareStream));
    if (f.zero_points) {
      QMOE_RETURN_IF_ERROR(tiled_of(shape, 1, zp));
      QMOE_RETURN_IF_ERROR(device_pack_zero_points(shape, raw.zero_points, E, *zp, kPrepareStream));
    }
    return cuda_status(cudaStreamSynchronize(kPrepareStream), "pack_int");
  };
  uint32_t *words1 = nullptr, *words2 = nullptr;
  uint8_t *scales1 = nullptr, *scales2 = nullptr, *zp1 = nullptr, *zp2 = nullptr;
  QMOE_RETURN_IF_ERROR(pack(spec_.fc1, w.fc1, fc1_, pack1_, &words1, &scales1, &zp1));
  QMOE_RETURN_IF_ERROR(pack(spec_.fc2, w.fc2, fc2_, pack2_, &words2, &scales2, &zp2));
  packed1_ = words1;
  packed2_ = words2;
  tiled_scales1_ = scales1;
  tiled_scales2_ = scales2;
  tiled_zp1_ = zp1;
  tiled_zp2_ = zp2;
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

GenericKind CudaLayer::generic_kind() const {
  // MXFP4 through an e4m3 copy on every FC (prepare_mixed_e4m3, or prepare_fp8_mxfp4).
  const bool mxfp4 = spec_.fc1.format == WeightFormat::kMxFp4 &&
                     spec_.fc2.format == WeightFormat::kMxFp4 &&
                     (!spec_.has_fc3() || spec_.fc3.format == WeightFormat::kMxFp4);
  // FP8 activations: an MXFP4 layer's window as measured against its FP8 generic path
  // (kE4m3Fp8, dispatch.h), the others' that of layers whose generic path reads their codes.
  if (act_fp8_) return mxfp4 ? GenericKind::kE4m3Fp8 : GenericKind::kReadsCodes;
  if (!all_mixed()) return GenericKind::kDequantize;
  // The narrow tile only where the automatic choice (or a forced 32) can take it on every FC,
  // and for the kinds whose window was measured against it (kInt4, kInt8, their zero-point
  // kinds, MXFP4's e4m3 copy; fp8's kE4m3 keeps the window of kReadsCodes).
  const bool narrow_allowed = mixed_tile_ == 0 || mixed_tile_ == 32;
  if (mxfp4) {
    return narrow_allowed && mixed_has_narrow_tile(MixedCodes::kE4m3, cdt_)
               ? GenericKind::kE4m3Copy
               : GenericKind::kReadsCodes;
  }
  int bits = 0;
  bool zero = false;  // some FC with zero points: their window (dispatch.h)
  for (const MixedFc* m : {&mixed1_, &mixed2_, spec_.has_fc3() ? &mixed3_ : nullptr}) {
    if (m == nullptr) continue;
    const bool measured = m->kind == MixedCodes::kInt4 || m->kind == MixedCodes::kInt8 ||
                          m->kind == MixedCodes::kInt4Zero || m->kind == MixedCodes::kInt8Zero;
    if (!narrow_allowed || !measured || !mixed_has_narrow_tile(m->kind, cdt_)) {
      return GenericKind::kReadsCodes;
    }
    bits = std::max(bits, mixed_code_bits(m->kind));
    zero = zero || mixed_has_zeros(m->kind);
  }
  if (zero) return bits <= 4 ? GenericKind::kZero4 : GenericKind::kZero8;
  return bits <= 4 ? GenericKind::kNarrow4 : GenericKind::kNarrow8;
}

Status CudaLayer::load_dispatch(const std::string& tune_file) {
  // The analytic window compares the mean routes per expert, T slots / E, with a cap. A shard's
  // held experts get the same mean (about T slots L / E routes over L experts), so E stays; its
  // tune rows are its own (tune_key names the local experts).
  // The generic path reads the codes themselves where the mixed-input GEMM takes every FC or
  // FP8 activations run both FCs on the FP8 GEMM (no dequantize pass), and wins sooner still
  // where every FC has the narrow tile (generic_kind()).
  DispatchTable table(decode_ready_, spec_.slots(), spec_.num_experts, generic_kind(),
                      fused_max_tokens_, expert_bytes(spec_),
                      spec_.routing.method == RoutingMethod::kGroupedTopK);
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

// The generic path with FP8 activations (PrepareOptions::act_quant = "fp8_e4m3"):
//
//   gather_fp8      each token's row -> e4m3 codes + scales per 128 columns (in hy), then
//                   copied by route position (xa, act_scales)
//   FC1 (+FC3)      FP8 grouped GEMM (cutlass_fp8.h) -> h (bf16); a separate FC3 without biases
//                   joins FC1 at prepare, so one GEMM runs both
//   activation      h -> the activation's e4m3 codes (xa again) + scales
//   FC2             FP8 grouped GEMM -> y (bf16, h's space)
//
// then the same finalize as every generic call, on bf16 rows (FinalizeArgs::y_dtype). The
// quantization is core/act_quant.h's; the weights are ORT's e4m3 codes with f32 block scales
// (fp8, fp8_block) or MXFP4's exact e4m3 copy with a scale per row and 128 columns
// (core/formats/fp4_e4m3.h), so nothing is dequantized. K runs in whole 128-column groups: where
// H or I is not a multiple of 128 (gpt-oss's 2880) the rows and the MXFP4 copies carry zeros up
// to hq_ / iq_, which add nothing to any sum.
#include <cstring>
#include <string>
#include <vector>

#include "core/act_quant.h"
#include "core/tensor_check.h"
#include "cuda/common/cuda_check.h"
#include "cuda/gemm/cutlass_fp8.h"
#include "cuda/layer/cuda_layer.h"

namespace qmoe::cuda {

Status CudaLayer::check_fp8_support() const {
  auto fail = [](const std::string& what) {
    return Status::invalid("act_quant: fp8_e4m3 " + what);
  };
  if (cdt_ != DType::kBF16 && cdt_ != DType::kF16) {
    return fail("takes bf16 or f16 activations, got " + std::string(dtype_name(cdt_)));
  }
  struct Fc {
    const char* name;
    const FcFormat& f;
    int64_t n, k;
  };
  std::vector<Fc> fcs = {{"fc1", spec_.fc1, spec_.fc1_rows(), spec_.hidden},
                         {"fc2", spec_.fc2, spec_.hidden, spec_.inter}};
  if (spec_.has_fc3()) fcs.push_back({"fc3", spec_.fc3, spec_.inter, spec_.hidden});
  for (const Fc& fc : fcs) {
    const bool block128 =
        fc.f.format == WeightFormat::kFp8Block && fc.f.block_size == kFp8ScaleBlock;
    const bool mxfp4 = fc.f.format == WeightFormat::kMxFp4;
    if (fc.f.format != WeightFormat::kFp8 && !block128 && !mxfp4) {
      return fail("runs fp8 (per expert), fp8_block b128 and mxfp4 weights, got " +
                  std::string(fc.name) + " " + fc.f.to_string());
    }
    // MXFP4's copy is built K-padded to 128 (its k a multiple of 32); ORT's e4m3 codes are read
    // as they stand, so their k must be a whole number of scale blocks.
    const int64_t kq = mxfp4 ? pad_fp8_k(fc.k) : fc.k;
    std::string why;
    if (!fp8_gemm_shape_ok(fc.n, kq, &why)) {
      return fail("needs " + std::string(fc.name) + "'s shape [n, k] with " + why);
    }
  }
  return Status::ok();
}

std::vector<float> CudaLayer::fp8_block_scales(const FcFormat& f, const FcWeights& w, int64_t n,
                                                int64_t k) const {
  const int64_t E = spec_.weight_experts();
  const int64_t nb = fp8_weight_scale_rows(n, /*row_scales=*/false), kb = k / kFp8ScaleBlock;
  // fp8_block b128's scales are already [E, ceil(n / 128), k / 128]: converted to f32 as they
  // stand. Per-expert fp8 repeats its global scale over the expert's blocks.
  std::vector<float> scales(static_cast<size_t>(E * nb * kb));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < nb * kb; ++i) {
      const int64_t at = e * nb * kb + i;
      scales[static_cast<size_t>(at)] =
          f.format == WeightFormat::kFp8 ? load_float(w.global_scale.data, DType::kF32, e)
                                         : load_float(w.scales.data, f.scale_dtype, at);
    }
  }
  return scales;
}

Status CudaLayer::fp8_part(const FcFormat& f, const FcWeights& w, DeviceFc* fc, int64_t kq,
                           Fp8Fc* out) {
  if (f.format == WeightFormat::kMxFp4) return prepare_fp8_mxfp4(fc, kq, out);
  if (fc->weight == nullptr) return Status::internal("fp8_part: the e4m3 codes were not uploaded");
  const std::vector<float> scales = fp8_block_scales(f, w, fc->n, fc->k);
  void* ps = nullptr;
  QMOE_RETURN_IF_ERROR(keep(scales.size() * sizeof(float), &ps));
  QMOE_CUDA_TRY(
      cudaMemcpy(ps, scales.data(), scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  out->codes = fc->weight;
  out->scales = static_cast<const float*>(ps);
  out->n = fc->n;
  out->k = fc->k;
  out->row_scales = false;
  return Status::ok();
}

Status CudaLayer::prepare_fp8(const LayerWeights& w) {
  const int64_t E = spec_.weight_experts();
  // Joins the parts' copies along n, per expert (each part's codes and scale rows after the
  // previous part's), into buffers of their own; the parts' buffers are freed.
  auto join = [&](const std::vector<Fp8Fc>& parts, Fp8Fc* out) -> Status {
    const int64_t k = parts[0].k, kb = k / kFp8ScaleBlock;
    int64_t n = 0, srows = 0;
    for (const Fp8Fc& p : parts) n += p.n, srows += p.scale_rows();
    void *pc = nullptr, *ps = nullptr;
    QMOE_RETURN_IF_ERROR(keep(static_cast<size_t>(E * n * k), &pc));
    QMOE_RETURN_IF_ERROR(keep(static_cast<size_t>(E * srows * kb) * sizeof(float), &ps));
    // One strided copy per part and array: E experts of rows x row bytes, into rows [row, row +
    // rows_p) of each expert's.
    int64_t row = 0, srow = 0;
    for (const Fp8Fc& p : parts) {
      const size_t code_bytes = static_cast<size_t>(p.n * k);
      QMOE_CUDA_TRY(cudaMemcpy2D(static_cast<uint8_t*>(pc) + row * k, static_cast<size_t>(n * k),
                                 p.codes, code_bytes, code_bytes, static_cast<size_t>(E),
                                 cudaMemcpyDeviceToDevice));
      const size_t scale_bytes = static_cast<size_t>(p.scale_rows() * kb) * sizeof(float);
      QMOE_CUDA_TRY(cudaMemcpy2D(static_cast<float*>(ps) + srow * kb,
                                 static_cast<size_t>(srows * kb) * sizeof(float), p.scales,
                                 scale_bytes, scale_bytes, static_cast<size_t>(E),
                                 cudaMemcpyDeviceToDevice));
      row += p.n, srow += p.scale_rows();
    }
    for (const Fp8Fc& p : parts) release(p.codes), release(p.scales);
    *out = parts[0];
    out->codes = static_cast<const uint8_t*>(pc);
    out->scales = static_cast<const float*>(ps);
    out->n = n;
    return Status::ok();
  };
  // FC1 and a separate FC3 join where one GEMM can run both: no biases (the activation reads
  // each bias by its own FC's rows), the same scale form, and block scales that do not straddle
  // the seam (FC1's n a whole number of 128-row blocks).
  const bool mx1 = spec_.fc1.format == WeightFormat::kMxFp4;
  fp8_joined_ = spec_.has_fc3() && !spec_.has_fc1_bias && !spec_.has_fc3_bias &&
                mx1 == (spec_.fc3.format == WeightFormat::kMxFp4) &&
                (mx1 || fc1_.n % kFp8ScaleBlock == 0);
  QMOE_RETURN_IF_ERROR(fp8_part(spec_.fc1, w.fc1, &fc1_, hq_, &fp8_1_));
  if (spec_.has_fc3()) QMOE_RETURN_IF_ERROR(fp8_part(spec_.fc3, w.fc3, &fc3_, hq_, &fp8_3_));
  if (fp8_joined_) {
    QMOE_RETURN_IF_ERROR(join({fp8_1_, fp8_3_}, &fp8_1_));
    fp8_3_ = Fp8Fc{};
    fc1_.weight = fc3_.weight = nullptr;  // the joined copy is the only reader
  }
  return fp8_part(spec_.fc2, w.fc2, &fc2_, iq_, &fp8_2_);
}

Status CudaLayer::run_fc_fp8(const Fp8Fc& f8, const Layout& l, char* ws, const RouteMapsView& maps,
                             const uint8_t* a, const float* a_scales, int64_t lda, uint16_t* c,
                             int64_t ldc, cudaStream_t stream) {
  Fp8GemmArgs g;
  g.a = a;
  g.a_scales = a_scales;
  g.lda = lda;
  g.c = c;
  g.ldc = ldc;
  g.n = f8.n;
  g.k = f8.k;
  g.codes = f8.codes;
  g.w_scales = f8.scales;
  g.row_scales = f8.row_scales;
  g.sched = schedule(l, ws, maps);
  g.max_groups = max_groups(maps);
  const int64_t routes = maps.tokens * spec_.slots();
  // The host knows the average rows per expert, routes / E (a shard's held experts share it).
  // PrepareOptions::mixed_tile 64 or 128 takes that tile at every count (A/B runs).
  g.tile_n = mixed_tile_ == 64 || mixed_tile_ == 128 ? mixed_tile_
             : routes >= kFp8WideRoutes * spec_.num_experts ? 128
                                                              : 64;
  return launch_fp8_grouped_gemm(g, sm_count_, ws + l.mixed, l.total - l.mixed, stream);
}

Status CudaLayer::run_generic_fp8(const RunInputs& in, const Layout& l, char* ws,
                                  const RouteMapsView& maps, cudaStream_t stream,
                                  RunProfile* profile) {
  const int slots = spec_.slots();
  uint8_t* xq = reinterpret_cast<uint8_t*>(ws + l.xa);
  float* xs = reinterpret_cast<float*>(ws + l.act_scales);
  uint16_t* h = reinterpret_cast<uint16_t*>(ws + l.hy);  // bf16 rows (cutlass_fp8.h)
  uint16_t* h3 = reinterpret_cast<uint16_t*>(ws + l.h3);
  // Each token's FP8 row first, in FC1's output space (dead until FC1 writes it), then copied to
  // every route of the token.
  uint8_t* token_codes = reinterpret_cast<uint8_t*>(ws + l.hy);
  float* token_scales = reinterpret_cast<float*>(token_codes + maps.tokens * hq_);
  QMOE_RETURN_IF_ERROR(launch_gather_fp8(in.input.data, spec_.act_dtype, spec_.hidden,
                                         maps.tokens, maps.permuted_route, slots, token_codes,
                                         token_scales, xq, hq_, xs, error_.as<int32_t>(),
                                         stream));
  ActivationArgs aa = activation_args(maps, h, h3);
  aa.h_dtype = aa.h3_dtype = DType::kBF16;
  if (fp8_joined_) {
    // FC1 and FC3 in one GEMM: rows [gate (I); linear (I)], the concatenated gated layout, over
    // FC1's and FC3's output space together (N1p + Ip = 2I columns).
    QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_1_, l, ws, maps, xq, xs, hq_, h, n1p_ + ip_, stream));
    aa.act.glu = GluLayout::kConcatenated;
    aa.ldh = n1p_ + ip_;
    aa.h3 = nullptr;
    aa.fc1_rows = 2 * spec_.inter;
  } else {
    QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_1_, l, ws, maps, xq, xs, hq_, h, n1p_, stream));
    if (spec_.has_fc3()) {
      QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_3_, l, ws, maps, xq, xs, hq_, h3, ip_, stream));
    }
  }
  aa.out_codes = xq;  // the gathered rows are dead once FC1 and FC3 have run
  aa.out_scales = xs;
  aa.ld = iq_;  // I rounded up to 128: FC2's K
  QMOE_RETURN_IF_ERROR(launch_activation(aa, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[2], stream));
  QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_2_, l, ws, maps, xq, xs, iq_, h, hp_, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[3], stream));
  return Status::ok();
}

}  // namespace qmoe::cuda

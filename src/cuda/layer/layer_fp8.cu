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
// quantization is core/act_quant.h's; the weights are ORT's e4m3 codes with f32 block scales, so
// nothing is dequantized.
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
    if (fc.f.format != WeightFormat::kFp8 && !block128) {
      return fail("runs fp8 (per expert) and fp8_block b128 weights, got " +
                  std::string(fc.name) + " " + fc.f.to_string());
    }
    std::string why;
    if (!fp8_gemm_shape_ok(fc.n, fc.k, &why)) {
      return fail("needs " + std::string(fc.name) + "'s shape [n, k] with " + why);
    }
  }
  return Status::ok();
}

std::vector<float> CudaLayer::fp8_block_scales(const FcFormat& f, const FcWeights& w, int64_t n,
                                                int64_t k) const {
  const int64_t E = spec_.weight_experts();
  const int64_t nb = (n + kFp8ScaleBlock - 1) / kFp8ScaleBlock, kb = k / kFp8ScaleBlock;
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

Status CudaLayer::prepare_fp8(const LayerWeights& w) {
  struct Part {
    const FcFormat& f;
    const FcWeights& w;
    const DeviceFc& fc;
  };
  const int64_t E = spec_.weight_experts();
  // One FP8 copy of the parts, stacked per expert along n (each part's codes and scale rows
  // after the previous part's): ORT's codes where there is one part, else a joined buffer.
  auto copy_of = [&](std::vector<Part> parts, Fp8Fc* out) -> Status {
    const int64_t k = parts[0].fc.k;
    int64_t n = 0;
    std::vector<std::vector<float>> scales;
    for (const Part& p : parts) {
      if (p.fc.weight == nullptr) {
        return Status::internal("prepare_fp8: the e4m3 codes were not uploaded");
      }
      n += p.fc.n;
      scales.push_back(fp8_block_scales(p.f, p.w, p.fc.n, k));
    }
    std::vector<float> joined;
    for (int64_t e = 0; e < E; ++e) {
      for (const std::vector<float>& s : scales) {
        const int64_t per = static_cast<int64_t>(s.size()) / E;
        joined.insert(joined.end(), s.begin() + e * per, s.begin() + (e + 1) * per);
      }
    }
    void* ps = nullptr;
    QMOE_RETURN_IF_ERROR(keep(joined.size() * sizeof(float), &ps));
    QMOE_CUDA_TRY(cudaMemcpy(ps, joined.data(), joined.size() * sizeof(float),
                             cudaMemcpyHostToDevice));
    out->scales = static_cast<const float*>(ps);
    out->n = n;
    out->k = k;
    if (parts.size() == 1) {
      out->codes = parts[0].fc.weight;
      return Status::ok();
    }
    void* pc = nullptr;
    QMOE_RETURN_IF_ERROR(keep(static_cast<size_t>(E * n * k), &pc));
    // One strided copy per part: E experts of n_p x k bytes, into rows [row, row + n_p) of each
    // expert's n.
    int64_t row = 0;
    for (const Part& p : parts) {
      const size_t bytes = static_cast<size_t>(p.fc.n * k);
      QMOE_CUDA_TRY(cudaMemcpy2D(static_cast<uint8_t*>(pc) + row * k, static_cast<size_t>(n * k),
                                 p.fc.weight, bytes, bytes, static_cast<size_t>(E),
                                 cudaMemcpyDeviceToDevice));
      row += p.fc.n;
    }
    for (const Part& p : parts) release(p.fc.weight);  // the joined copy is the only reader
    out->codes = static_cast<const uint8_t*>(pc);
    return Status::ok();
  };
  fp8_joined_ = spec_.has_fc3() && !spec_.has_fc1_bias && !spec_.has_fc3_bias;
  if (fp8_joined_) {
    QMOE_RETURN_IF_ERROR(copy_of({{spec_.fc1, w.fc1, fc1_}, {spec_.fc3, w.fc3, fc3_}}, &fp8_1_));
    fc1_.weight = fc3_.weight = nullptr;
  } else {
    QMOE_RETURN_IF_ERROR(copy_of({{spec_.fc1, w.fc1, fc1_}}, &fp8_1_));
    if (spec_.has_fc3()) QMOE_RETURN_IF_ERROR(copy_of({{spec_.fc3, w.fc3, fc3_}}, &fp8_3_));
  }
  return copy_of({{spec_.fc2, w.fc2, fc2_}}, &fp8_2_);
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
  g.sched = schedule(l, ws, maps);
  g.max_groups = max_groups(maps);
  const int64_t routes = maps.tokens * spec_.slots();
  // The host knows the average rows per expert, routes / E (a shard's held experts share it).
  g.tile_n = routes >= kFp8WideRoutes * spec_.num_experts ? 128 : 64;
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
  float* token_scales = reinterpret_cast<float*>(token_codes + maps.tokens * hp_);
  QMOE_RETURN_IF_ERROR(launch_gather_fp8(in.input.data, spec_.act_dtype, spec_.hidden,
                                         maps.tokens, maps.permuted_route, slots, token_codes,
                                         token_scales, xq, hp_, xs, error_.as<int32_t>(),
                                         stream));
  ActivationArgs aa = activation_args(maps, h, h3);
  aa.h_dtype = aa.h3_dtype = DType::kBF16;
  if (fp8_joined_) {
    // FC1 and FC3 in one GEMM: rows [gate (I); linear (I)], the concatenated gated layout, over
    // FC1's and FC3's output space together (N1p + Ip = 2I columns).
    QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_1_, l, ws, maps, xq, xs, hp_, h, n1p_ + ip_, stream));
    aa.act.glu = GluLayout::kConcatenated;
    aa.ldh = n1p_ + ip_;
    aa.h3 = nullptr;
    aa.fc1_rows = 2 * spec_.inter;
  } else {
    QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_1_, l, ws, maps, xq, xs, hp_, h, n1p_, stream));
    if (spec_.has_fc3()) {
      QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_3_, l, ws, maps, xq, xs, hp_, h3, ip_, stream));
    }
  }
  aa.out_codes = xq;  // the gathered rows are dead once FC1 and FC3 have run
  aa.out_scales = xs;
  aa.ld = ip_;  // = I (check_fp8_support: a multiple of 128)
  QMOE_RETURN_IF_ERROR(launch_activation(aa, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[2], stream));
  QMOE_RETURN_IF_ERROR(run_fc_fp8(fp8_2_, l, ws, maps, xq, xs, ip_, h, hp_, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[3], stream));
  return Status::ok();
}

}  // namespace qmoe::cuda

// The generic path with FP8 activations (PrepareOptions::act_quant = "fp8_e4m3"):
//
//   gather_fp8      input rows by route position -> e4m3 codes (xa) + scales per 128 columns
//   FC1 (+FC3)      FP8 grouped GEMM (cutlass_fp8.h) -> h (f32)
//   activation      h -> the activation's e4m3 codes (xa again) + scales
//   FC2             FP8 grouped GEMM -> y (f32, h's space)
//
// then the same finalize as every generic call. The quantization is core/act_quant.h's; the
// weights are ORT's e4m3 codes with f32 block scales, so nothing is dequantized.
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

Status CudaLayer::prepare_fp8(const FcFormat& f, const FcWeights& w, const DeviceFc& fc,
                              Fp8Fc* out) {
  *out = Fp8Fc{};
  if (fc.weight == nullptr) {
    return Status::internal("prepare_fp8: the e4m3 codes were not uploaded");
  }
  const int64_t E = spec_.weight_experts();
  const int64_t nb = (fc.n + kFp8ScaleBlock - 1) / kFp8ScaleBlock, kb = fc.k / kFp8ScaleBlock;
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
  void* p = nullptr;
  QMOE_RETURN_IF_ERROR(keep(scales.size() * sizeof(float), &p));
  QMOE_CUDA_TRY(cudaMemcpy(p, scales.data(), scales.size() * sizeof(float),
                           cudaMemcpyHostToDevice));
  out->codes = fc.weight;
  out->scales = static_cast<const float*>(p);
  return Status::ok();
}

Status CudaLayer::run_fc_fp8(const DeviceFc& fc, const Fp8Fc& f8, const Layout& l, char* ws,
                             const RouteMapsView& maps, const uint8_t* a, const float* a_scales,
                             int64_t lda, float* c, int64_t ldc, cudaStream_t stream) {
  Fp8GemmArgs g;
  g.a = a;
  g.a_scales = a_scales;
  g.lda = lda;
  g.c = c;
  g.ldc = ldc;
  g.n = fc.n;
  g.k = fc.k;
  g.codes = f8.codes;
  g.w_scales = f8.scales;
  g.sched.touched = reinterpret_cast<const int32_t*>(ws + l.touched);
  g.sched.n_touched = reinterpret_cast<const int32_t*>(ws + l.n_touched);
  g.sched.offsets = maps.expert_offsets;
  const int64_t routes = maps.tokens * spec_.slots();
  g.max_groups = static_cast<int>(std::min<int64_t>(spec_.weight_experts(), routes));
  // The host knows the average rows per expert, routes / E (a shard's held experts share it).
  g.tile_n = routes >= kFp8WideRoutes * spec_.num_experts ? 128 : 64;
  return launch_fp8_grouped_gemm(g, sm_count_, ws + l.mixed, l.total - l.mixed, stream);
}

Status CudaLayer::run_generic_fp8(const RunInputs& in, const Layout& l, char* ws,
                                  const RouteMapsView& maps, cudaStream_t stream,
                                  RunProfile* profile) {
  const int slots = spec_.slots();
  const int64_t routes = maps.tokens * slots;
  uint8_t* xq = reinterpret_cast<uint8_t*>(ws + l.xa);
  float* xs = reinterpret_cast<float*>(ws + l.act_scales);
  float* h = reinterpret_cast<float*>(ws + l.hy);
  float* h3 = reinterpret_cast<float*>(ws + l.h3);
  QMOE_RETURN_IF_ERROR(launch_gather_fp8(in.input.data, spec_.act_dtype, spec_.hidden,
                                         maps.permuted_route, slots, routes, xq, hp_, xs,
                                         error_.as<int32_t>(), stream));
  QMOE_RETURN_IF_ERROR(run_fc_fp8(fc1_, fp8_1_, l, ws, maps, xq, xs, hp_, h, n1p_, stream));
  if (spec_.has_fc3()) {
    QMOE_RETURN_IF_ERROR(run_fc_fp8(fc3_, fp8_3_, l, ws, maps, xq, xs, hp_, h3, ip_, stream));
  }
  ActivationArgs aa = activation_args(maps, h, h3);
  aa.out_codes = xq;  // the gathered rows are dead once FC1 and FC3 have run
  aa.out_scales = xs;
  aa.ld = ip_;  // = I (check_fp8_support: a multiple of 128)
  QMOE_RETURN_IF_ERROR(launch_activation(aa, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[2], stream));
  QMOE_RETURN_IF_ERROR(run_fc_fp8(fc2_, fp8_2_, l, ws, maps, xq, xs, ip_, h, hp_, stream));
  if (profile) QMOE_CUDA_TRY(cudaEventRecord(events_[3], stream));
  return Status::ok();
}

}  // namespace qmoe::cuda

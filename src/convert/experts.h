// One MoE layer's experts as a checkpoint stores them, resolved and validated up front, and turned
// into qmoe's FC1/FC2 one expert at a time.
//
// FC1 interleaves the two input projections row by row, FC2 is the down projection:
//
//   FC1 [2I, H]: row 2i = gate_proj (w1) row i, row 2i + 1 = up_proj (w3) row i
//   FC2 [H, I]:  down_proj (w2)
//
// GPTQ tensors of one projection with logical W [N, K] (y = x W^T), b bits, groups of g along K,
// p = 32 / b codes per int32, as AutoGPTQ / GPTQModel pack them:
//
//   qweight i32 [K/p, N]    bits [b*j, b*j + b) of qweight[r, n] = code of W[n, p*r + j]
//   qzeros  i32 [K/g, N/p]  bits [b*j, b*j + b) of qzeros[G, c]  = stored zero of (G, n = p*c + j)
//   scales  f16 [K/g, N]    (per channel: one group, K/g = 1)
//   g_idx   i32 [K]         optional: the group of each column (act-order permutes them)
//
//   W[n, k] = scales[G, n] * (code - zero),  G = g_idx[k] (k / g without act-order),
//   zero = stored + 1 (checkpoint_format gptq, "v1") or stored (gptq_v2)
//
// GPTQ is read in gptq.cpp (act-order drawn there), AWQ and compressed-tensors in packed_int.cpp
// (their layouts drawn there).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "convert/checkpoint.h"
#include "qmoe/quantize.h"

namespace qmoe::convert {

// The tensors of one projection of one expert.
struct ProjTensors {
  std::string name;  // checkpoint prefix, e.g. model.layers.3.mlp.experts.5.up_proj
  int64_t n = 0, k = 0;
  TensorView weight;                   // float sources: [N, K]
  TensorView bias;                     // gpt-oss: [N]
  TensorView qweight, qzeros, scales;  // GPTQ, AWQ; compressed-tensors: weight_packed,
                                       // weight_zero_point (absent when symmetric), weight_scale;
                                       // NVFP4: weight, -, weight_scale
  TensorView global;                   // NVFP4: weight_scale_2, one f32
  TensorView g_idx{};                  // GPTQ: [K] when present ({}: aggregate initializers
                                       // above may leave it out)
  // Float sources: element (n, k) of W is element offset + n * row + k * col of `weight` (row 0:
  // k, a plain row-major [N, K]). Fused checkpoints that store y = x W ([K, N], transposed) and
  // a slice of a wider shared expert are read in place this way.
  struct Layout {
    int64_t offset = 0, row = 0, col = 1;
  } at{};
};

// A projection named `name` of logical W [n, k], its tensors not yet resolved; `at` where a float
// source's weight holds it.
ProjTensors proj_of(std::string name, int64_t n, int64_t k, const TensorView& weight = {},
                    ProjTensors::Layout at = {});

struct ExpertTensors {
  ProjTensors gate, up, down;
  // Slice `slice` of `slices` of a quantized shared MLP wider than the routed experts: gate, up
  // and down are the whole MLP's projections (slice_expert.cpp).
  int64_t slice = 0, slices = 1;
};

// Whether `from` is a float source (bf16, fp16, fp32), and the dtype its expert weights must have.
bool is_float_source(SourceFormat from);
DType source_dtype(SourceFormat f);

// Expert e's slice of a tensor whose first dimension is the expert, as a tensor of `dims`.
TensorView expert_slice(const TensorView& v, int64_t e, std::initializer_list<int64_t> dims);

struct LayerSource {
  int index = 0;
  std::string router_name;
  TensorView router;             // [E, H], f32/f16/bf16
  TensorView router_bias;        // DeepSeek-V3: e_score_correction_bias [E], f32/f16/bf16
  TensorView router_logit_bias;  // gpt-oss: router.bias [E], added to the logits
  // The routed experts, then the shared ones (MoeModelConfig::num_shared(): slices of the
  // shared MLP of `inter` rows each).
  std::vector<ExpertTensors> experts;
  // The shared experts' router column (Qwen2-MoE: shared_expert_gate [1, H], one row for every
  // shared expert).
  TensorView shared_gate;
  int64_t source_bytes = 0;
};

// Resolves and checks every tensor of decoder layer `index` (names, dtypes, shapes, GPTQ groups
// and g_idx); errors name the shard file and the tensor.
Status resolve_layer(const Checkpoint& ckpt, SourceFormat from, int index, LayerSource* out);

// Resolves one projection p (name, n, k set) as `from` stores it (a float weight [N, K], or the
// quantizer's tensors); *bytes grows by what it reads.
Status resolve_proj(const Checkpoint& c, SourceFormat from, DType* scale_dtype, ProjTensors* p,
                    int64_t* bytes);

// Shared experts (shared_experts.cpp): appends the shared experts of the MoE block `prefix`
// (e.g. model.layers.3.mlp.) to out->experts, and the shared gate where the model has one.
Status resolve_shared(const Checkpoint& c, SourceFormat from, const std::string& prefix,
                      DType* scale_dtype, LayerSource* out);

// Llama-4 (llama4.cpp): resolves a whole MoE layer of float experts, routed and shared.
Status resolve_llama4_layer(const Checkpoint& c, SourceFormat from, int index, LayerSource* out);

// The qmoe format a quantized checkpoint maps onto: int4/int8, block = group size (0 per channel),
// zero points unless symmetric, scales in the checkpoint's scale dtype.
FcFormat quantized_fc_format(const MoeModelConfig& c, SourceFormat from, DType scale_dtype);

// Checks a scale tensor: [rows, cols] of a float dtype; the first one read decides the dtype
// (*scale_dtype == kU8 until then) and every other must agree.
Status expect_scales(const Checkpoint& c, const std::string& name, DType* scale_dtype, int64_t rows,
                     int64_t cols, TensorView* out);

// A float tensor (f32, f16 or bf16) of the given shape; the message names file and tensor.
Status expect_float(const Checkpoint& c, const std::string& name,
                    std::initializer_list<int64_t> shape, TensorView* out);

// Widens every element of a float tensor (f32, f16 or bf16) to fp32 (exact).
void widen(const TensorView& v, float* out);

// gpt-oss (gpt_oss.cpp): resolves a whole MoE layer. MXFP4: each expert's FC1 in `gate` and FC2
// in `down` (slices of the fused tensors), which transcode copies into mxfp4. Float: gate, up and
// down read in place from the fused [E, H, 2I] and [E, I, H] tensors (ProjTensors::at), FC1's
// bias [2I] in gate.bias and FC2's in down.bias.
Status resolve_gpt_oss_layer(const Checkpoint& c, SourceFormat from, int index, LayerSource* out);

// Sets code `i` of an LSB-first bitstream of `bits`-bit codes (4 or 8).
void put_code(uint8_t* stream, int64_t i, int bits, uint32_t code);

// The error "FILE: tensor 'name': what" for a tensor of the checkpoint.
Status tensor_error(const Checkpoint& c, const std::string& name, const std::string& what);

// GPTQ (gptq.cpp): resolve checks one projection's tensors and its g_idx.
Status resolve_gptq(const Checkpoint& c, const GptqConfig& g, DType* scale_dtype, ProjTensors* p,
                    int64_t* bytes);

// AWQ and compressed-tensors (packed_int.cpp): resolve checks one projection's tensors;
// transcode writes its codes, scales and zero points into rows row0, row0 + stride, ... of
// expert 0 of fc. Both map exactly onto qmoe's int4/int8.
Status resolve_awq(const Checkpoint& c, const AwqConfig& a, DType* scale_dtype, ProjTensors* p,
                   int64_t* bytes);
void transcode_awq(const ProjTensors& p, const AwqConfig& a, int64_t row0, int64_t stride,
                   QuantizedFc* fc);
Status resolve_compressed(const Checkpoint& c, const CompressedTensorsConfig& q, DType* scale_dtype,
                          ProjTensors* p, int64_t* bytes);
void transcode_compressed(const ProjTensors& p, const CompressedTensorsConfig& q, int64_t row0,
                          int64_t stride, QuantizedFc* fc);

// Block-scaled FP8 (fp8_block.cpp): copies codes and scales into rows [row0, row0 + N) of expert
// 0 of fc (row0 a multiple of the block).
Status resolve_fp8(const Checkpoint& c, const Fp8Config& f, DType* scale_dtype, ProjTensors* p,
                   int64_t* bytes);
void transcode_fp8(const ProjTensors& p, const Fp8Config& f, int64_t row0, QuantizedFc* fc);

struct ExpertStats {
  bool requantized = false;
  double requant_error = 0;  // relative-norm error of the requantized FCs (worst)
  // GPTQ act-order: the intermediate index was reordered to make down_proj's groups contiguous
  // (exact); an FC was requantized because its g_idx has no contiguous equivalent.
  bool reordered = false;
  bool act_order_requantized = false;
};

// Scratch of one worker: per-expert QuantizedFc (experts = 1) and fp32 staging.
struct ExpertScratch {
  QuantizedFc fc1, fc2;
  std::vector<float> w1, w2;
  std::vector<float> b1, b2;            // FC biases (gpt-oss); empty for unbiased layers
  std::unique_ptr<ExpertScratch> wide;  // a wide shared MLP before slicing (convert_slice)
};

// Requantizes expert 0 of fc from w [n, k] with qmoe's quantizer; *err receives the relative-norm
// error of the result against w.
Status requantize(const std::vector<float>& w, int64_t n, int64_t k, QuantizedFc* fc, double* err);

// ModelOpt NVFP4 (nvfp4.cpp): resolve checks one projection; convert copies one expert into
// scratch's nvfp4 FCs, requantizing FC1 when gate and up have different global scales.
Status resolve_nvfp4(const Checkpoint& c, ProjTensors* p, int64_t* bytes);
Status convert_nvfp4(const ExpertTensors& t, ExpertScratch* s, ExpertStats* stats);

// compressed-tensors float-quantized FP8 (fp8_block.cpp): block scales map exactly onto
// fp8_block, a tensor scale onto fp8 (FC1 requantized when gate and up scales differ), channel
// scales are requantized into fp8_block.
Status resolve_compressed_fp8(const Checkpoint& c, const CompressedTensorsConfig& q,
                              DType* scale_dtype, ProjTensors* p, int64_t* bytes);
Status convert_compressed_fp8(const ExpertTensors& t, const CompressedTensorsConfig& q,
                              ExpertScratch* s, ExpertStats* stats);

// Copies one gpt-oss expert (resolve_gpt_oss_layer) into scratch's mxfp4 FCs and biases.
void transcode_gpt_oss(const ExpertTensors& t, ExpertScratch* s);

// Converts one GPTQ expert into scratch's FCs: exact where the groups are (or can be reordered
// to be) contiguous, requantized from GPTQ's dequantization otherwise.
Status convert_gptq(const ExpertTensors& t, const GptqConfig& g, ExpertScratch* s,
                    ExpertStats* stats);

// Drops the mapped pages of every tensor of one expert (it has been converted).
void release_expert(const Checkpoint& ckpt, const ExpertTensors& t);

// Float sources (float_experts.cpp): widens one expert's projections (ProjTensors::at) into
// scratch's fp32 staging, FC1 rows interleaved, and quantizes them; biases where gate.bias is
// present (FC1's, already interleaved) and down.bias.
Status convert_float_expert(const ExpertTensors& t, ExpertScratch* s);

// Converts one expert into scratch->fc1 / fc2 (allocated by the caller for one expert in the
// target formats).
Status convert_expert(const ExpertTensors& t, SourceFormat from, const MoeModelConfig& cfg,
                      ExpertScratch* scratch, ExpertStats* stats);

// Slicing a quantized shared MLP (slice_expert.cpp): slice_rows copies FC rows
// [row0, row0 + out->n) and slice_columns FC columns [col0, col0 + out->k) (cut on a group
// boundary) of `wide` into expert 0 of *out, for int4/int8 formats; convert_slice transcodes
// t.slices' whole MLP into scratch->wide, then cuts slice t.slice out of it into scratch's FCs.
Status slice_rows(const QuantizedFc& wide, int64_t row0, QuantizedFc* out);
Status slice_columns(const QuantizedFc& wide, int64_t col0, QuantizedFc* out);
Status convert_slice(const ExpertTensors& t, SourceFormat from, const MoeModelConfig& cfg,
                     ExpertScratch* scratch, ExpertStats* stats);

}  // namespace qmoe::convert

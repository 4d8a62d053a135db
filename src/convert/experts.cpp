#include "convert/experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/numeric.h"

namespace qmoe::convert {

namespace {

// Mixtral and Phi-3.5-MoE: block_sparse_moe.experts.N.{w1,w3,w2}; the others mlp.experts.N.*_proj.
bool mixtral_names(MoeArch arch) { return arch == MoeArch::kMixtral || arch == MoeArch::kPhiMoe; }

std::string block_prefix(MoeArch arch, int layer) {
  return "model.layers." + std::to_string(layer) +
         (mixtral_names(arch) ? ".block_sparse_moe." : ".mlp.");
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

float load_f32(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::kF32:
      return static_cast<const float*>(v.data)[i];
    case DType::kF16:
      return num::f16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
    default:
      return num::bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
  }
}

}  // namespace

Status expect_float(const Checkpoint& c, const std::string& name,
                    std::initializer_list<int64_t> shape, TensorView* out) {
  std::string file;
  QMOE_RETURN_IF_ERROR(c.tensor(name, out, &file));
  if (!is_float(out->dtype)) {
    return Status::invalid(file + ": tensor '" + name + "': expected F32, F16 or BF16, got " +
                           safetensors_dtype_name(out->dtype));
  }
  return c.expect(name, out->dtype, shape, out);
}

Status requantize(const std::vector<float>& w, int64_t n, int64_t k, QuantizedFc* fc, double* err) {
  QMOE_RETURN_IF_ERROR(quantize_expert(w.data(), 0, fc));
  std::vector<float> row(static_cast<size_t>(k));
  const FcWeights view = fc->view();
  double num = 0, den = 0;
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row<float>(fc->format, view, n, k, 0, r, row.data());
    for (int64_t i = 0; i < k; ++i) {
      const double ref = w[static_cast<size_t>(r * k + i)];
      num += (row[i] - ref) * (row[i] - ref);
      den += ref * ref;
    }
  }
  *err = den > 0 ? std::sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
  return Status::ok();
}

void widen(const TensorView& v, float* out) {
  for (int64_t i = 0; i < v.numel(); ++i) out[i] = load_f32(v, i);
}

void put_code(uint8_t* stream, int64_t i, int bits, uint32_t code) {
  if (bits == 8) {
    stream[i] = static_cast<uint8_t>(code);
  } else {
    uint8_t& b = stream[i / 2];
    b = static_cast<uint8_t>((i & 1) ? (b & 0x0F) | (code << 4) : (b & 0xF0) | code);
  }
}

Status expect_scales(const Checkpoint& c, const std::string& name, DType* scale_dtype, int64_t rows,
                     int64_t cols, TensorView* out) {
  std::string file;
  QMOE_RETURN_IF_ERROR(c.tensor(name, out, &file));
  if (*scale_dtype == DType::kU8) {  // the first projection decides; the rest must agree
    if (!is_float(out->dtype)) {
      return Status::invalid(file + ": tensor '" + name + "': expected F16, BF16 or F32, got " +
                             safetensors_dtype_name(out->dtype));
    }
    *scale_dtype = out->dtype;
  }
  return c.expect(name, *scale_dtype, {rows, cols}, out);
}

FcFormat quantized_fc_format(const MoeModelConfig& c, SourceFormat from, DType scale_dtype) {
  FcFormat f;
  int bits = 4;
  if (from == SourceFormat::kGptq) {
    bits = c.gptq.bits;
    f.block_size = c.gptq.group_size;
    f.zero_points = !c.gptq.sym;
  } else if (from == SourceFormat::kAwq) {
    f.block_size = c.awq.group_size;
    f.zero_points = true;
  } else if (from == SourceFormat::kCompressedTensors && c.ct.fp8) {
    // block: the checkpoint's blocks; tensor: fp8 (f32 global); channel: requantized, b128.
    f.format = c.ct.fp8_tensor ? WeightFormat::kFp8 : WeightFormat::kFp8Block;
    f.block_size = c.ct.fp8_tensor ? 0 : (c.ct.group_size > 0 ? c.ct.group_size : 128);
    f.scale_dtype = c.ct.group_size > 0 ? scale_dtype : DType::kF32;
    return f;
  } else if (from == SourceFormat::kCompressedTensors) {
    bits = c.ct.bits;
    f.block_size = c.ct.group_size;
    f.zero_points = !c.ct.sym;
  } else if (from == SourceFormat::kMxfp4) {
    return default_fc_format(WeightFormat::kMxFp4);  // block 32, e8m0 scales, K-packed
  } else if (from == SourceFormat::kNvfp4) {
    return default_fc_format(WeightFormat::kNvFp4);  // block 16, e4m3 scales, K-packed
  } else {
    f.format = WeightFormat::kFp8Block;
    f.block_size = c.fp8.block;
    f.scale_dtype = is_float(scale_dtype) ? scale_dtype : DType::kF32;  // E8M0 widened, exact
    return f;
  }
  f.format = bits == 8 ? WeightFormat::kInt8 : WeightFormat::kInt4;
  f.scale_dtype = scale_dtype;
  return f;
}

DType source_dtype(SourceFormat f) {
  switch (f) {
    case SourceFormat::kBf16:
      return DType::kBF16;
    case SourceFormat::kFp16:
      return DType::kF16;
    default:
      return DType::kF32;
  }
}

Status resolve_proj(const Checkpoint& c, SourceFormat from, DType* scale_dtype, ProjTensors* p,
                    int64_t* bytes) {
  const MoeModelConfig& cfg = c.config();
  switch (from) {
    case SourceFormat::kGptq:
      return resolve_gptq(c, cfg.gptq, scale_dtype, p, bytes);
    case SourceFormat::kAwq:
      return resolve_awq(c, cfg.awq, scale_dtype, p, bytes);
    case SourceFormat::kCompressedTensors:
      return cfg.ct.fp8 ? resolve_compressed_fp8(c, cfg.ct, scale_dtype, p, bytes)
                        : resolve_compressed(c, cfg.ct, scale_dtype, p, bytes);
    case SourceFormat::kFp8:
      return resolve_fp8(c, cfg.fp8, scale_dtype, p, bytes);
    case SourceFormat::kNvfp4:
      return resolve_nvfp4(c, p, bytes);
    default:
      QMOE_RETURN_IF_ERROR(
          c.expect(p->name + ".weight", source_dtype(from), {p->n, p->k}, &p->weight));
      *bytes += static_cast<int64_t>(p->weight.bytes());
      return Status::ok();
  }
}

Status resolve_layer(const Checkpoint& c, SourceFormat from, int index, LayerSource* out) {
  const MoeModelConfig& cfg = c.config();
  if (cfg.arch == MoeArch::kGptOss ? !(from == SourceFormat::kMxfp4 || is_float_source(from))
                                   : from == SourceFormat::kMxfp4) {
    return Status::unsupported(c.dir() + "/config.json: model_type '" + cfg.model_type +
                               "', --from " + source_format_name(from) +
                               ": --from mxfp4 reads gpt-oss's MXFP4 experts, and gpt_oss "
                               "checkpoints are read from MXFP4 or floats only");
  }
  if (cfg.arch == MoeArch::kGptOss) return resolve_gpt_oss_layer(c, from, index, out);
  if (cfg.arch == MoeArch::kLlama4) return resolve_llama4_layer(c, from, index, out);
  const std::string prefix = block_prefix(cfg.arch, index);
  const bool qwen = !mixtral_names(cfg.arch);  // Qwen2/3 and DeepSeek name them alike
  LayerSource l;
  l.index = index;
  l.router_name = prefix + "gate.weight";
  QMOE_RETURN_IF_ERROR(expect_float(c, l.router_name, {cfg.num_experts, cfg.hidden}, &l.router));
  l.source_bytes = static_cast<int64_t>(l.router.bytes());
  if (cfg.arch == MoeArch::kDeepseekV3) {
    QMOE_RETURN_IF_ERROR(expect_float(c, prefix + "gate.e_score_correction_bias", {cfg.num_experts},
                                      &l.router_bias));
    l.source_bytes += static_cast<int64_t>(l.router_bias.bytes());
  }
  DType scale_dtype = DType::kU8;  // not yet known
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    const std::string ep = prefix + "experts." + std::to_string(e) + ".";
    ExpertTensors t;
    t.gate = proj_of(ep + (qwen ? "gate_proj" : "w1"), cfg.inter, cfg.hidden);
    t.up = proj_of(ep + (qwen ? "up_proj" : "w3"), cfg.inter, cfg.hidden);
    t.down = proj_of(ep + (qwen ? "down_proj" : "w2"), cfg.hidden, cfg.inter);
    for (ProjTensors* p : {&t.gate, &t.up, &t.down}) {
      QMOE_RETURN_IF_ERROR(resolve_proj(c, from, &scale_dtype, p, &l.source_bytes));
    }
    l.experts.push_back(t);
  }
  if (cfg.num_shared() > 0) QMOE_RETURN_IF_ERROR(resolve_shared(c, from, prefix, &scale_dtype, &l));
  *out = std::move(l);
  return Status::ok();
}

void release_expert(const Checkpoint& ckpt, const ExpertTensors& t) {
  for (const ProjTensors* p : {&t.gate, &t.up, &t.down}) {
    for (const TensorView* v :
         {&p->weight, &p->qweight, &p->qzeros, &p->scales, &p->bias, &p->global, &p->g_idx}) {
      if (v->present()) ckpt.release(*v);
    }
  }
}

Status convert_expert(const ExpertTensors& t, SourceFormat from, const MoeModelConfig& cfg,
                      ExpertScratch* s, ExpertStats* stats) {
  if (from == SourceFormat::kNvfp4) return convert_nvfp4(t, s, stats);
  if (from == SourceFormat::kCompressedTensors && cfg.ct.fp8) {
    return convert_compressed_fp8(t, cfg.ct, s, stats);
  }
  if (from == SourceFormat::kMxfp4) {  // FC1 and FC2 whole, in `gate` and `down`
    transcode_gpt_oss(t, s);
    return Status::ok();
  }
  if (is_float_source(from)) return convert_float_expert(t, s);
  const int64_t inter = t.gate.n;
  std::fill(s->fc1.zero_points.begin(), s->fc1.zero_points.end(), 0);
  std::fill(s->fc2.zero_points.begin(), s->fc2.zero_points.end(), 0);
  if (from == SourceFormat::kAwq) {  // every AWQ code, zero and scale has a qmoe slot
    transcode_awq(t.gate, cfg.awq, 0, 2, &s->fc1);
    transcode_awq(t.up, cfg.awq, 1, 2, &s->fc1);
    transcode_awq(t.down, cfg.awq, 0, 1, &s->fc2);
    return Status::ok();
  }
  if (from == SourceFormat::kFp8) {  // [gate; up] stacked: the blocks stay whole
    transcode_fp8(t.gate, cfg.fp8, 0, &s->fc1);
    transcode_fp8(t.up, cfg.fp8, inter, &s->fc1);
    transcode_fp8(t.down, cfg.fp8, 0, &s->fc2);
    return Status::ok();
  }
  if (from == SourceFormat::kCompressedTensors) {  // the same
    transcode_compressed(t.gate, cfg.ct, 0, 2, &s->fc1);
    transcode_compressed(t.up, cfg.ct, 1, 2, &s->fc1);
    transcode_compressed(t.down, cfg.ct, 0, 1, &s->fc2);
    return Status::ok();
  }
  return convert_gptq(t, cfg.gptq, s, stats);
}

}  // namespace qmoe::convert

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

Status where(const Checkpoint& c, const std::string& name, std::string* file) {
  TensorView v;
  return c.tensor(name, &v, file);
}

// g_idx must be the identity grouping k / g: act-order checkpoints permute K, which qmoe's
// contiguous blocks cannot express.
Status check_g_idx(const Checkpoint& c, const std::string& name, int64_t k, int64_t group) {
  TensorView v;
  std::string file;
  QMOE_RETURN_IF_ERROR(c.tensor(name, &v, &file));
  if (v.dtype != DType::kI32 || v.rank != 1 || v.dims[0] != k) {
    return Status::invalid(file + ": tensor '" + name + "': expected I32 [" + std::to_string(k) +
                           "], got " + safetensors_dtype_name(v.dtype) + " " + v.shape_string());
  }
  const auto* g = static_cast<const int32_t*>(v.data);
  for (int64_t i = 0; i < k; ++i) {
    if (g[i] != i / group) {
      return Status::unsupported(
          file + ": tensor '" + name + "': g_idx[" + std::to_string(i) +
          "] = " + std::to_string(g[i]) + ", expected " + std::to_string(i / group) +
          ": desc_act (act-order) checkpoints are not supported; quantize with desc_act=false");
    }
  }
  return Status::ok();
}

Status resolve_gptq(const Checkpoint& c, const GptqConfig& g, DType* scale_dtype, ProjTensors* p,
                    int64_t* bytes) {
  const int64_t per = 32 / g.bits;
  const int64_t group = g.group_size > 0 ? g.group_size : p->k;
  std::string file;
  if (p->k % per != 0 || p->n % per != 0 || p->k % group != 0) {
    QMOE_RETURN_IF_ERROR(where(c, p->name + ".qweight", &file));
    return Status::invalid(file + ": tensor '" + p->name + ".qweight': [N, K] = [" +
                           std::to_string(p->n) + ", " + std::to_string(p->k) +
                           "] does not fit GPTQ " + std::to_string(g.bits) +
                           "-bit packing with group_size " + std::to_string(group) +
                           " (K and N multiples of " + std::to_string(per) + ", K of the group)");
  }
  const int64_t groups = p->k / group;
  QMOE_RETURN_IF_ERROR(
      c.expect(p->name + ".qweight", DType::kI32, {p->k / per, p->n}, &p->qweight));
  QMOE_RETURN_IF_ERROR(
      expect_scales(c, p->name + ".scales", scale_dtype, groups, p->n, &p->scales));
  QMOE_RETURN_IF_ERROR(
      c.expect(p->name + ".qzeros", DType::kI32, {groups, p->n / per}, &p->qzeros));
  if (c.has(p->name + ".g_idx")) {
    QMOE_RETURN_IF_ERROR(check_g_idx(c, p->name + ".g_idx", p->k, group));
  } else if (g.desc_act) {
    QMOE_RETURN_IF_ERROR(where(c, p->name + ".qweight", &file));
    return Status::unsupported(file + ": tensor '" + p->name +
                               "': quantization_config.desc_act is true and there is no g_idx: "
                               "act-order checkpoints are not supported");
  }
  *bytes += static_cast<int64_t>(p->qweight.bytes() + p->scales.bytes() + p->qzeros.bytes());
  return Status::ok();
}

uint32_t field(const TensorView& v, int64_t row, int64_t col, int64_t j, int bits) {
  const auto word =
      static_cast<uint32_t>(static_cast<const int32_t*>(v.data)[row * v.dims[1] + col]);
  return (word >> (bits * j)) & ((1u << bits) - 1u);
}

// Writes projection p's codes, scales and zero points into rows row0, row0 + stride, ... of
// expert 0 of fc. Returns false in *exact when a zero point is outside what fc can hold (a
// symmetric fc holds only 2^(bits-1); an asymmetric one 0 .. 2^bits - 1).
void transcode(const ProjTensors& p, const GptqConfig& g, int64_t row0, int64_t stride,
               QuantizedFc* fc, bool* exact) {
  const int bits = g.bits;
  const int64_t per = 32 / bits;
  const int64_t group = g.group_size > 0 ? g.group_size : p.k;
  const int64_t groups = p.k / group;
  const int64_t row_bytes = p.k * bits / 8;
  const int64_t zp_row_bytes = (groups * bits + 7) / 8;
  const size_t ssize = dtype_size(p.scales.dtype);
  const uint32_t mid = 1u << (bits - 1), top = (1u << bits) - 1u;
  const auto* scales = static_cast<const uint8_t*>(p.scales.data);
  // A GPTQ word holds p consecutive k of one n, code j in bits [b*j, b*j + b): read as 4
  // little-endian bytes that is exactly qmoe's row layout (int4: low nibble = even k; int8: one
  // byte per k). So the codes move as a transpose of 32-bit words, qweight[r, n] -> word r of row
  // n, in tiles so that both sides stay in cache.
  const auto* qweight = static_cast<const uint32_t*>(p.qweight.data);
  const int64_t words = p.k / per;
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < words; r0 += kTile) {
    for (int64_t n0 = 0; n0 < p.n; n0 += kTile) {
      for (int64_t r = r0; r < std::min(words, r0 + kTile); ++r) {
        for (int64_t n = n0; n < std::min(p.n, n0 + kTile); ++n) {
          std::memcpy(fc->weight.data() + (row0 + n * stride) * row_bytes + r * 4,
                      qweight + r * p.n + n, 4);
        }
      }
    }
  }
  for (int64_t n = 0; n < p.n; ++n) {
    const int64_t row = row0 + n * stride;
    for (int64_t G = 0; G < groups; ++G) {
      std::memcpy(fc->scales.data() + (row * groups + G) * ssize, scales + (G * p.n + n) * ssize,
                  ssize);
      const uint32_t zero = field(p.qzeros, G, n / per, n % per, bits) + (g.v2 ? 0u : 1u);
      if (!fc->format.zero_points) {
        if (zero != mid) *exact = false;
      } else if (zero > top) {
        *exact = false;
      } else if (g.group_size > 0) {
        put_code(fc->zero_points.data() + row * zp_row_bytes, G, bits, zero);
      } else {
        put_code(fc->zero_points.data(), row, bits, zero);
      }
    }
  }
}

// GPTQ's dequantization of projection p into rows row0, row0 + stride, ... of w [*, K] (fp32;
// exact: |code - zero| <= 2^bits and the scale has at most 24 significant bits).
void dequantize_gptq(const ProjTensors& p, const GptqConfig& g, int64_t row0, int64_t stride,
                     float* w) {
  const int bits = g.bits;
  const int64_t per = 32 / bits;
  const int64_t group = g.group_size > 0 ? g.group_size : p.k;
  for (int64_t n = 0; n < p.n; ++n) {
    float* out = w + (row0 + n * stride) * p.k;
    for (int64_t k = 0; k < p.k; ++k) {
      const int64_t G = k / group;
      const float zero =
          static_cast<float>(field(p.qzeros, G, n / per, n % per, bits) + (g.v2 ? 0 : 1));
      const float code = static_cast<float>(field(p.qweight, k / per, n, k % per, bits));
      out[k] = (code - zero) * load_f32(p.scales, G * p.n + n);
    }
  }
}

// Widens rows of v [n, k] into rows row0, row0 + stride, ... of w; one loop per dtype so that each
// vectorizes (bf16 is a shift).
void load_rows(const TensorView& v, int64_t n, int64_t k, int64_t row0, int64_t stride, float* w) {
  for (int64_t r = 0; r < n; ++r) {
    float* out = w + (row0 + r * stride) * k;
    if (v.dtype == DType::kF32) {
      std::memcpy(out, static_cast<const float*>(v.data) + r * k, static_cast<size_t>(k) * 4);
    } else if (v.dtype == DType::kBF16) {
      const uint16_t* in = static_cast<const uint16_t*>(v.data) + r * k;
      for (int64_t i = 0; i < k; ++i) {
        const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
        std::memcpy(out + i, &bits, 4);
      }
    } else {
      const uint16_t* in = static_cast<const uint16_t*>(v.data) + r * k;
      for (int64_t i = 0; i < k; ++i) out[i] = num::f16_to_f32(in[i]);
    }
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
    f.scale_dtype = scale_dtype;
    return f;
  }
  f.format = bits == 8 ? WeightFormat::kInt8 : WeightFormat::kInt4;
  f.scale_dtype = scale_dtype;
  return f;
}

Status resolve_layer(const Checkpoint& c, SourceFormat from, int index, LayerSource* out) {
  const MoeModelConfig& cfg = c.config();
  if ((cfg.arch == MoeArch::kGptOss) != (from == SourceFormat::kMxfp4)) {
    return Status::unsupported(c.dir() +
                               "/config.json: --from mxfp4 reads gpt-oss's MXFP4 experts, and "
                               "gpt_oss checkpoints are read only that way (model_type '" +
                               cfg.model_type + "', --from " + source_format_name(from) + ")");
  }
  if (from == SourceFormat::kMxfp4) return resolve_gpt_oss_layer(c, index, out);
  const std::string prefix = block_prefix(cfg.arch, index);
  const bool qwen = !mixtral_names(cfg.arch);  // Qwen3 and DeepSeek name them alike
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
    t.gate = {ep + (qwen ? "gate_proj" : "w1"), cfg.inter, cfg.hidden, {}, {}, {}, {}, {}, {}};
    t.up = {ep + (qwen ? "up_proj" : "w3"), cfg.inter, cfg.hidden, {}, {}, {}, {}, {}, {}};
    t.down = {ep + (qwen ? "down_proj" : "w2"), cfg.hidden, cfg.inter, {}, {}, {}, {}, {}, {}};
    for (ProjTensors* p : {&t.gate, &t.up, &t.down}) {
      if (from == SourceFormat::kGptq) {
        QMOE_RETURN_IF_ERROR(resolve_gptq(c, cfg.gptq, &scale_dtype, p, &l.source_bytes));
      } else if (from == SourceFormat::kAwq) {
        QMOE_RETURN_IF_ERROR(resolve_awq(c, cfg.awq, &scale_dtype, p, &l.source_bytes));
      } else if (from == SourceFormat::kCompressedTensors && cfg.ct.fp8) {
        QMOE_RETURN_IF_ERROR(resolve_compressed_fp8(c, cfg.ct, &scale_dtype, p, &l.source_bytes));
      } else if (from == SourceFormat::kCompressedTensors) {
        QMOE_RETURN_IF_ERROR(resolve_compressed(c, cfg.ct, &scale_dtype, p, &l.source_bytes));
      } else if (from == SourceFormat::kFp8) {
        QMOE_RETURN_IF_ERROR(resolve_fp8(c, cfg.fp8, &scale_dtype, p, &l.source_bytes));
      } else if (from == SourceFormat::kNvfp4) {
        QMOE_RETURN_IF_ERROR(resolve_nvfp4(c, p, &l.source_bytes));
      } else {
        QMOE_RETURN_IF_ERROR(
            c.expect(p->name + ".weight", source_dtype(from), {p->n, p->k}, &p->weight));
        l.source_bytes += static_cast<int64_t>(p->weight.bytes());
      }
    }
    l.experts.push_back(t);
  }
  *out = std::move(l);
  return Status::ok();
}

void release_expert(const Checkpoint& ckpt, const ExpertTensors& t) {
  for (const ProjTensors* p : {&t.gate, &t.up, &t.down}) {
    for (const TensorView* v :
         {&p->weight, &p->qweight, &p->qzeros, &p->scales, &p->bias, &p->global}) {
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
  const int64_t inter = t.gate.n, hidden = t.gate.k;
  s->w1.resize(static_cast<size_t>(2 * inter * hidden));
  s->w2.resize(static_cast<size_t>(hidden * inter));
  if (from == SourceFormat::kBf16 || from == SourceFormat::kFp16 || from == SourceFormat::kFp32) {
    load_rows(t.gate.weight, inter, hidden, 0, 2, s->w1.data());
    load_rows(t.up.weight, inter, hidden, 1, 2, s->w1.data());
    load_rows(t.down.weight, hidden, inter, 0, 1, s->w2.data());
    Status st = quantize_expert(s->w1.data(), 0, &s->fc1);
    if (!st.is_ok()) {
      return Status(st.code(), t.gate.name + ".weight / " + t.up.name +
                                   ".weight (FC1 rows interleave them): " + st.message());
    }
    st = quantize_expert(s->w2.data(), 0, &s->fc2);
    if (!st.is_ok()) return Status(st.code(), t.down.name + ".weight: " + st.message());
    return Status::ok();
  }
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
  const GptqConfig& gptq = cfg.gptq;
  bool exact1 = true, exact2 = true;
  transcode(t.gate, gptq, 0, 2, &s->fc1, &exact1);
  transcode(t.up, gptq, 1, 2, &s->fc1, &exact1);
  transcode(t.down, gptq, 0, 1, &s->fc2, &exact2);
  double err = 0;
  if (!exact1) {
    dequantize_gptq(t.gate, gptq, 0, 2, s->w1.data());
    dequantize_gptq(t.up, gptq, 1, 2, s->w1.data());
    QMOE_RETURN_IF_ERROR(requantize(s->w1, 2 * inter, hidden, &s->fc1, &err));
    stats->requant_error = std::max(stats->requant_error, err);
  }
  if (!exact2) {
    dequantize_gptq(t.down, gptq, 0, 1, s->w2.data());
    QMOE_RETURN_IF_ERROR(requantize(s->w2, hidden, inter, &s->fc2, &err));
    stats->requant_error = std::max(stats->requant_error, err);
  }
  stats->requantized = !exact1 || !exact2;
  return Status::ok();
}

}  // namespace qmoe::convert

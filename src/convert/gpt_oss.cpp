// gpt-oss's MoE blocks (transformers modeling_gpt_oss.py and its MXFP4 integration), read into
// qmoe's mxfp4 (the unquantized release: below, quantized as floats). All experts of a layer live
// in one tensor per kind:
//
//   mlp.router.weight                   [E, H]          logits = x W^T + bias
//   mlp.router.bias                     [E]
//   mlp.experts.gate_up_proj_blocks     u8 [E, 2I, H/32, 16]   two E2M1 codes a byte along H:
//                                                              low nibble = even h, high = odd h
//   mlp.experts.gate_up_proj_scales     u8 [E, 2I, H/32]       e8m0: 2^(s - 127) per 32 along H
//   mlp.experts.gate_up_proj_bias       [E, 2I]
//   mlp.experts.down_proj_{blocks,scales,bias}  [E, H, I/32, 16], [E, H, I/32], [E, H]
//
//   W[e, n, h] = e2m1(code) * 2^(scale[e, n, h/32] - 127)
//
// Rows 2i and 2i + 1 of gate_up are gate row i and up row i: qmoe's interleaved FC1. The blocks
// of one expert, read as [2I, H/2] bytes, are qmoe's K-packed mxfp4 weight and the scales its
// e8m0 scales, so both are copied and the per-expert global scale is 1: exact.
#include <cstring>

#include "convert/experts.h"

namespace qmoe::convert {

namespace {

// The blocks, scales and bias of one fused projection of logical [E, N, K].
Status resolve_fused(const Checkpoint& c, const std::string& name, int64_t e, int64_t n, int64_t k,
                     TensorView* blocks, TensorView* scales, TensorView* bias, int64_t* bytes) {
  if (k % 32 != 0) {
    TensorView v;
    std::string file;
    QMOE_RETURN_IF_ERROR(c.tensor(name + "_blocks", &v, &file));
    return Status::invalid(file + ": tensor '" + name + "_blocks': K = " + std::to_string(k) +
                           " is not a multiple of the MXFP4 block 32");
  }
  QMOE_RETURN_IF_ERROR(c.expect(name + "_blocks", DType::kU8, {e, n, k / 32, 16}, blocks));
  QMOE_RETURN_IF_ERROR(c.expect(name + "_scales", DType::kU8, {e, n, k / 32}, scales));
  QMOE_RETURN_IF_ERROR(expect_float(c, name + "_bias", {e, n}, bias));
  *bytes += static_cast<int64_t>(blocks->bytes() + scales->bytes() + bias->bytes());
  return Status::ok();
}

// The unquantized release (e.g. a bf16 export) stores each expert's projections as y = x W:
//
//   mlp.experts.gate_up_proj       [E, H, 2I]   column 2i: gate row i, column 2i + 1: up row i
//   mlp.experts.gate_up_proj_bias  [E, 2I]
//   mlp.experts.down_proj          [E, I, H]
//   mlp.experts.down_proj_bias     [E, H]
//
// read in place (ProjTensors::at) and quantized like any float expert; the biases are the
// MXFP4 release's.
Status resolve_float_experts(const Checkpoint& c, SourceFormat from, const std::string& prefix,
                             LayerSource* l) {
  const MoeModelConfig& cfg = c.config();
  const int64_t E = cfg.num_experts, H = cfg.hidden, I = cfg.inter;
  const std::string fc1 = prefix + "experts.gate_up_proj", fc2 = prefix + "experts.down_proj";
  TensorView w1, w2, bias1, bias2;
  QMOE_RETURN_IF_ERROR(c.expect(fc1, source_dtype(from), {E, H, 2 * I}, &w1));
  QMOE_RETURN_IF_ERROR(c.expect(fc2, source_dtype(from), {E, I, H}, &w2));
  QMOE_RETURN_IF_ERROR(expect_float(c, fc1 + "_bias", {E, 2 * I}, &bias1));
  QMOE_RETURN_IF_ERROR(expect_float(c, fc2 + "_bias", {E, H}, &bias2));
  l->source_bytes += static_cast<int64_t>(w1.bytes() + w2.bytes() + bias1.bytes() + bias2.bytes());
  for (int64_t e = 0; e < E; ++e) {
    const std::string at = "[" + std::to_string(e) + "]";
    ExpertTensors t;
    const TensorView gate_up = expert_slice(w1, e, {H, 2 * I});
    t.gate = proj_of(fc1 + at + "[:, 0::2]", I, H, gate_up, {0, 2, 2 * I});
    t.gate.bias = expert_slice(bias1, e, {2 * I});  // FC1's, interleaved as FC1
    t.up = proj_of(fc1 + at + "[:, 1::2]", I, H, gate_up, {1, 2, 2 * I});
    t.down = proj_of(fc2 + at, H, I, expert_slice(w2, e, {I, H}), {0, 1, H});
    t.down.bias = expert_slice(bias2, e, {H});
    l->experts.push_back(t);
  }
  return Status::ok();
}

}  // namespace

Status resolve_gpt_oss_layer(const Checkpoint& c, SourceFormat from, int index, LayerSource* out) {
  const MoeModelConfig& cfg = c.config();
  const int64_t E = cfg.num_experts, H = cfg.hidden, I = cfg.inter;
  const std::string prefix = "model.layers." + std::to_string(index) + ".mlp.";
  LayerSource l;
  l.index = index;
  l.router_name = prefix + "router.weight";
  QMOE_RETURN_IF_ERROR(expect_float(c, l.router_name, {E, H}, &l.router));
  QMOE_RETURN_IF_ERROR(expect_float(c, prefix + "router.bias", {E}, &l.router_logit_bias));
  l.source_bytes = static_cast<int64_t>(l.router.bytes() + l.router_logit_bias.bytes());
  if (from != SourceFormat::kMxfp4) {
    QMOE_RETURN_IF_ERROR(resolve_float_experts(c, from, prefix, &l));
    *out = std::move(l);
    return Status::ok();
  }
  TensorView b1, s1, bias1, b2, s2, bias2;
  const std::string fc1 = prefix + "experts.gate_up_proj", fc2 = prefix + "experts.down_proj";
  QMOE_RETURN_IF_ERROR(resolve_fused(c, fc1, E, 2 * I, H, &b1, &s1, &bias1, &l.source_bytes));
  QMOE_RETURN_IF_ERROR(resolve_fused(c, fc2, E, H, I, &b2, &s2, &bias2, &l.source_bytes));
  for (int64_t e = 0; e < E; ++e) {
    ExpertTensors t;
    t.gate.name = fc1 + "[" + std::to_string(e) + "]";
    t.gate.n = 2 * I;
    t.gate.k = H;
    t.gate.qweight = expert_slice(b1, e, {2 * I, H / 2});
    t.gate.scales = expert_slice(s1, e, {2 * I, H / 32});
    t.gate.bias = expert_slice(bias1, e, {2 * I});
    t.down.name = fc2 + "[" + std::to_string(e) + "]";
    t.down.n = H;
    t.down.k = I;
    t.down.qweight = expert_slice(b2, e, {H, I / 2});
    t.down.scales = expert_slice(s2, e, {H, I / 32});
    t.down.bias = expert_slice(bias2, e, {H});
    l.experts.push_back(t);
  }
  *out = std::move(l);
  return Status::ok();
}

void transcode_gpt_oss(const ExpertTensors& t, ExpertScratch* s) {
  const std::pair<const ProjTensors*, QuantizedFc*> fcs[2] = {{&t.gate, &s->fc1},
                                                              {&t.down, &s->fc2}};
  std::vector<float>* biases[2] = {&s->b1, &s->b2};
  for (int i = 0; i < 2; ++i) {
    const ProjTensors& p = *fcs[i].first;
    QuantizedFc* fc = fcs[i].second;
    std::memcpy(fc->weight.data(), p.qweight.data, p.qweight.bytes());
    std::memcpy(fc->scales.data(), p.scales.data, p.scales.bytes());
    fc->global_scale[0] = 1.0f;
    biases[i]->resize(static_cast<size_t>(p.n));
    widen(p.bias, biases[i]->data());
  }
}

}  // namespace qmoe::convert

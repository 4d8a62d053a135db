// Shared experts: the MLP a model's MoE block runs on every token besides the routed experts.
// qmoe holds them as the last experts of the layer (RoutingSpec::num_shared), always on, with
// router columns of their own:
//
//   Qwen2-MoE    mlp.shared_expert.{gate,up,down}_proj    [S, H], [S, H], [H, S]
//                mlp.shared_expert_gate.weight             [1, H]   weight sigmoid(x . gate)
//   DeepSeek-V3  mlp.shared_experts.{gate,up,down}_proj   S = n_shared_experts * I, weight 1
//   Llama-4      feed_forward.shared_expert.*              S = I, weight 1
//
// A weight-1 expert (SharedWeight::kOne) reads no router column: it gets a row of zeros.
// The layer's experts all have the routed experts' I rows, so a shared MLP of S = m * I rows
// becomes m experts: an FFN is a sum over its intermediate rows,
//
//   down (silu(gate x) * up x) = sum_c down[:, R_c] (silu(gate[R_c] x) * up[R_c] x),
//   R_c = [cI, (c+1)I)
//
// so slice c takes gate and up rows [cI, (c+1)I) and down columns [cI, (c+1)I), and every slice
// gets the same weight (the same router column). Float sources read the slices in place
// (ProjTensors::at). Integer sources (GPTQ, AWQ, compressed-tensors pack-quantized) are
// transcoded whole and then cut (slice_expert.cpp), which needs down_proj's groups to divide I;
// FP8 and NVFP4 shared MLPs wider than I are refused.
#include "convert/experts.h"

namespace qmoe::convert {

namespace {

std::string span(int64_t begin, int64_t end) {
  return std::to_string(begin) + ":" + std::to_string(end);
}

}  // namespace

Status resolve_shared(const Checkpoint& c, SourceFormat from, const std::string& prefix,
                      DType* scale_dtype, LayerSource* out) {
  const MoeModelConfig& cfg = c.config();
  const int64_t H = cfg.hidden, I = cfg.inter, S = cfg.shared_inter, m = cfg.num_shared();
  const std::string sp =
      prefix + (cfg.arch == MoeArch::kDeepseekV3 ? "shared_experts." : "shared_expert.");
  if (cfg.arch == MoeArch::kQwen2Moe) {
    QMOE_RETURN_IF_ERROR(
        expect_float(c, prefix + "shared_expert_gate.weight", {1, H}, &out->shared_gate));
    out->source_bytes += static_cast<int64_t>(out->shared_gate.bytes());
  }
  ExpertTensors whole;
  whole.gate = proj_of(sp + "gate_proj", S, H);
  whole.up = proj_of(sp + "up_proj", S, H);
  whole.down = proj_of(sp + "down_proj", H, S);
  // The format the source transcodes into decides whether its codes can be cut (integers only).
  const bool is_float = is_float_source(from);
  const FcFormat quantized = is_float ? FcFormat{} : quantized_fc_format(cfg, from, DType::kF32);
  const bool integer = !is_float && quantized.info().kind == FormatKind::kInteger;
  if (m > 1 && !is_float && !integer) {
    return Status::unsupported(
        c.dir() + ": " + sp + "*: a shared expert of " + std::to_string(S) + " rows is held as " +
        std::to_string(m) + " experts of " + std::to_string(I) +
        " rows; slicing it is supported for float and integer sources (bf16, fp16, fp32, gptq, "
        "awq, compressed-tensors pack-quantized), not --from " +
        source_format_name(from));
  }
  for (ProjTensors* p : {&whole.gate, &whole.up, &whole.down}) {
    QMOE_RETURN_IF_ERROR(resolve_proj(c, from, scale_dtype, p, &out->source_bytes));
  }
  if (m == 1) {
    out->experts.push_back(whole);
    return Status::ok();
  }
  if (!is_float) {
    const int64_t group = quantized.block_size;
    if (group > 0 && I % group != 0) {
      return Status::unsupported(c.dir() + ": " + sp + "down_proj: its groups of " +
                                 std::to_string(group) + " columns straddle the cuts every " +
                                 std::to_string(I) + " columns that make the shared expert of " +
                                 std::to_string(S) + " rows " + std::to_string(m) +
                                 " experts; the cut needs a group size that divides " +
                                 std::to_string(I));
    }
    for (int64_t s = 0; s < m; ++s) {
      ExpertTensors t = whole;
      t.slice = s;
      t.slices = m;
      out->experts.push_back(t);
    }
    return Status::ok();
  }
  for (int64_t s = 0; s < m; ++s) {
    const int64_t r0 = s * I, r1 = r0 + I;
    ExpertTensors t = whole;
    t.gate.name = sp + "gate_proj.weight[" + span(r0, r1) + "]";
    t.up.name = sp + "up_proj.weight[" + span(r0, r1) + "]";
    t.down.name = sp + "down_proj.weight[:, " + span(r0, r1) + "]";
    t.gate.n = t.up.n = I;
    t.gate.at = t.up.at = {r0 * H, H, 1};
    t.down.k = I;
    t.down.at = {r0, S, 1};
    out->experts.push_back(t);
  }
  return Status::ok();
}

}  // namespace qmoe::convert

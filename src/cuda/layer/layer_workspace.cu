// The workspace layout of one call (cuda_layer.h): the exact formula workspace_size() reports.
#include "core/act_quant.h"
#include "cuda/gemm/cutlass_fp8.h"
#include "cuda/gemm/cutlass_grouped.h"
#include "cuda/gemm/cutlass_mixed.h"
#include "cuda/layer/cuda_layer.h"

namespace qmoe::cuda {

// Byte offsets of one call's buffers in the workspace. With R = T * slots, A() rounding up to
// 256 bytes, cs = sizeof(activation dtype), Xp = X rounded up to a multiple of 32, E the router's
// experts and L the experts the layer holds (LayerSpec::weight_experts(); L = E unless sharded):
//   maps        A(route_maps_bytes(T, slots, E))      routing runs over all E
//   plan        A(4 L) + A(4) + A(4 (L + 1))          touched, n_touched, tile_start (held only),
//               + A(4 L)                              the decode kernels' FC1 -> FC2 counters
//   route_temp  A(general_routing_temp_bytes(T))      0 when T <= 64 (the fused routing path)
//   xa          A(max(cs R max(Hp, Ip), R Q))         gathered input, later the activation
//                                                     (FP8 rows: their e4m3 codes, Q = max(Hq,
//                                                     Iq) with act_quant, Xq = X rounded up to
//                                                     128, else 0)
//   act_scales  A(4 R Q / 128)                        the FP8 rows' scales (act_quant only)
//   ya          A(cs R Ip)                            FC1's activated rows where its GEMM's
//                                                     epilogue may activate (act_epilogue_: every
//                                                     call, so the total stays monotone in T),
//                                                     else 0
//   hy          A(max(hs R (N1p + [Ip with FC3]),     FC1 (+FC3) outputs in f32 (hs = 4), in bf16
//                     4 R Hp, R (Hq + 4 Hq / 128)))   with act_quant (hs = 2), later FC2's (f32
//                                                     from the decode kernels, which act_quant
//                                                     layers run too; bf16 from the FP8 path);
//                                                     before FC1, the FP8 path's per-token rows:
//                                                     T Hq codes and 4 T Hq / 128 scales (the
//                                                     last term, act_quant only)
//   scratch     A(cs S max(N1 Hp, [I Hp], H Ip))      dequantized weights of S experts
//   cutlass     A(cutlass_gemm_workspace_bytes(S))    the CUTLASS GEMM's group arrays and TMA
//                                                     descriptors (layers on CUTLASS only)
//   mixed       A(max over FC1 and FC3 with a         the mixed-input GEMM's group arrays and
//               mixed-input copy of                   descriptors for FC1 and FC3 (FCs of one
//               mixed_gemm_workspace_bytes(kind,      layer may differ in kind, e.g. FC2 per
//               min(L, R)))                           channel); with act_quant, the FP8 GEMM's
//               or A(fp8_gemm_workspace_bytes(
//               min(L, R)))
//   mixed2      A(mixed_gemm_workspace_bytes(kind2,   FC2's, apart from FC1's: the routing may
//               min(L, R))), FC2 with that copy and   write both GEMMs' group arrays before FC1
//               no act_quant, else 0                  runs (DeviceRoutingArgs::plan_setups)
//   fused       max over T' <= min(T, F) of           the fused kernel's partial sums,
//               fused_decode_workspace_bytes(T')      activations and FC1 -> FC2 counters (layers
//                                                     it takes; F = fused_max_tokens_): the
//                                                     maximum keeps the total monotone in T
// S = max(1, min(L, R, floor(max_dequant_bytes / (cs max(...))))): a call never needs more
// slots than it can touch experts, so decode shapes get a small scratch. A shard's R rows of xa
// and hy keep every route's position (the maps are the whole layer's); other shards' rows go
// unwritten. Where every FC runs
// on the mixed-input GEMM, or on the FP8 one, nothing is dequantized: scratch and cutlass are 0.
Status CudaLayer::layout(int64_t t, Layout* l) const {
  const int slots = spec_.slots();
  const int64_t E = spec_.num_experts;
  const int64_t L = spec_.weight_experts();
  const int64_t r = t * slots;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align_up(bytes);
    return at;
  };
  l->maps = take(route_maps_bytes(t, slots, E));
  l->touched = take(4 * L);
  l->n_touched = take(4);
  l->tile_start = take(4 * (L + 1));
  l->ready = take(4 * L);
  size_t temp = 0;
  QMOE_RETURN_IF_ERROR(general_routing_temp_bytes(t, slots, E, &temp));
  l->route_temp_bytes = temp;
  l->route_temp = take(temp);
  // The FP8 path's rows (act_quant): a byte per column of hq_ / iq_, a scale per 128 columns.
  const int64_t q_cols = act_fp8_ ? std::max(hq_, iq_) : 0;
  l->xa = take(std::max<int64_t>(cs_ * r * std::max(hp_, ip_), r * q_cols));
  l->act_scales = take(4 * r * q_cols / kActQuantGroup);
  const int64_t h_cols = n1p_ + (spec_.has_fc3() ? ip_ : 0);
  l->ya = take(act_epilogue_ ? cs_ * r * ip_ : 0);
  const int64_t hs = act_fp8_ ? 2 : 4;  // the FP8 GEMM's rows are bf16 (cutlass_fp8.h)
  // hy also holds the FP8 path's per-token rows (tokens <= r) before FC1 writes it.
  const int64_t token_rows = act_fp8_ ? r * (hq_ + 4 * hq_ / kActQuantGroup) : 0;
  l->hy = take(std::max({hs * r * h_cols, 4 * r * hp_, token_rows}));
  l->h3 = l->hy + hs * r * n1p_;
  const int64_t per_slot = static_cast<int64_t>(cs_) * slot_elems_;
  const int64_t by_cap = static_cast<int64_t>(dequant_cap_ / static_cast<size_t>(per_slot));
  const int64_t reach = std::min<int64_t>(L, r);
  l->slots_in_scratch = std::max<int64_t>(1, std::min(reach, by_cap));
  l->waves = reach == 0 ? 0 : (reach + l->slots_in_scratch - 1) / l->slots_in_scratch;
  const bool dequant = !all_mixed() && !act_fp8_;
  l->scratch = take(static_cast<size_t>(per_slot) * (t > 0 && dequant ? l->slots_in_scratch : 0));
  l->cutlass = take(cutlass_ && dequant && t > 0
                        ? cutlass_gemm_workspace_bytes(cdt_, l->slots_in_scratch, sm_count_)
                        : 0);
  size_t mixed = 0, mixed2 = 0;
  for (const MixedFc* m : {&mixed1_, &mixed3_}) {
    if (m->on() && t > 0) {
      mixed = std::max(mixed, mixed_gemm_workspace_bytes(m->kind, cdt_, reach, sm_count_));
    }
  }
  if (mixed2_.on() && t > 0)
    mixed2 = mixed_gemm_workspace_bytes(mixed2_.kind, cdt_, reach, sm_count_);
  if (act_fp8_ && t > 0) mixed = fp8_gemm_workspace_bytes(reach, sm_count_), mixed2 = 0;
  l->mixed = take(mixed);
  l->mixed2 = take(mixed2);
  l->fused = take(fused_ws_.empty()
                      ? 0
                      : fused_ws_[static_cast<size_t>(std::min<int64_t>(t, fused_max_tokens_))]);
  l->total = off;
  return Status::ok();
}

}  // namespace qmoe::cuda

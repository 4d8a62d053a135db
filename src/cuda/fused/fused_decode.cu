// The fused decode kernel's launcher (see fused_decode.h): which layers it takes, the slice width,
// the shared-memory geometry and the grid (planned once per layer and token count), the
// cooperative launch, and the turn from runtime widths into
// template arguments (fused_kernel_for, one file per width).
#include <algorithm>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/decode/decode_launch.h"
#include "cuda/fused/fused_decode.h"
#include "cuda/fused/fused_launch.h"
#include "cuda/routing/route_warp.cuh"

namespace qmoe::cuda {

using namespace fused_detail;

namespace {

int chunk_k(const MmaPackShape& s) { return 16 * s.steps_per_chunk; }

// Steps per scale block where blocks are shorter than a chunk, else 0 (also per channel).
int steps_per_block(const MmaPackShape& s) {
  return s.block_size == 0 || s.block_size >= chunk_k(s) ? 0 : s.block_size / 16;
}

int chunks_per_block(const MmaPackShape& s) {
  if (s.block_size == 0) return static_cast<int>(s.chunks);
  return std::max(1, s.block_size / chunk_k(s));
}

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

const void* kernel_for(int bits, bool bf16, int spb) {
  switch (bits) {
    case 2:
      return fused_kernel_for<2>(bf16, spb);
    case 4:
      return fused_kernel_for<4>(bf16, spb);
    case 8:
      return fused_kernel_for<8>(bf16, spb);
    default:
      return nullptr;
  }
}

FusedGeometry fused_geometry(const FusedShape& sh, int tokens, int units) {
  const MmaPackShape& s1 = sh.fc1;
  const MmaPackShape& s2 = sh.fc2;
  FusedGeometry g;
  g.units = units;
  g.slices = static_cast<int>((sh.inter + units - 1) / units);
  const int rows = std::min(tokens, kFusedDecodeMaxTokens);
  // Row strides of 16 halves modulo 32: the B loads of a half-warp's rows meet no bank twice
  // (decode_gemv.cu's geometry()).
  const int kpad = static_cast<int>(s1.chunks) * chunk_k(s1);
  g.ld1 = kpad % 32 == 0 ? kpad + 16 : kpad;
  g.lda = units % 32 == 0 ? units + 16 : units;
  g.zrow_len = (std::max(g.ld1, g.lda) + 7) / 8 * 8;
  g.nbp1 = static_cast<int>(s1.scale_blocks);
  g.cpb1 = chunks_per_block(s1);
  g.nbs2 = s2.block_size == 0 ? 1 : std::max(1, units / s2.block_size);
  g.cpb2 = chunks_per_block(s2);
  g.spb = steps_per_block(s1);
  const int upt1 = s1.map == MmaRowMap::kIdentity ? 16 : 8;
  const size_t tiles1 = static_cast<size_t>(units / upt1);
  const size_t routing_bytes = static_cast<size_t>(kFusedWarps) *
                               routing_detail::routing_warp_floats(sh.experts, sh.slots) * 4;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off += align16(bytes);
    return static_cast<int>(o);
  };
  g.off_xs = take(std::max(static_cast<size_t>(rows) * g.ld1 * 2, routing_bytes));
  g.off_zrow = take(static_cast<size_t>(g.zrow_len) * 2);
  g.off_acts = take(static_cast<size_t>(rows) * g.lda * 2);
  g.off_sc1 = take(tiles1 * 16 * g.nbp1 * 4);
  g.off_zs1 = take(sh.zp1 ? tiles1 * 16 * g.nbp1 * 4 : 0);
  g.off_sc2 = take(static_cast<size_t>(s2.tiles) * 16 * g.nbs2 * 4);
  g.off_zs2 = take(sh.zp2 ? static_cast<size_t>(s2.tiles) * 16 * g.nbs2 * 4 : 0);
  // The weight rings take what the budget leaves (at least kRingMinSlots per warp, so that a
  // geometry over the budget stays over it and is refused).
  const size_t per_slot = static_cast<size_t>(kFusedWarps) * (kChunkBytes + kBarrierBytes);
  const size_t room = kFusedSmemBudget > off + 16 ? (kFusedSmemBudget - off - 16) / per_slot : 0;
  g.ring = static_cast<int>(std::clamp<size_t>(room, kRingMinSlots, kRingMaxSlots));
  g.off_ring = take(static_cast<size_t>(kFusedWarps) * g.ring * kChunkBytes);
  g.off_bars = take(static_cast<size_t>(kFusedWarps) * g.ring * kBarrierBytes);
  g.smem = off;
  return g;
}

bool pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

bool fused_decode_supports(const FusedShape& sh, DType act_dtype) {
  const MmaPackShape& s1 = sh.fc1;
  const MmaPackShape& s2 = sh.fc2;
  if (act_dtype != DType::kBF16 && act_dtype != DType::kF16) return false;
  if (s1.codes != MmaCodes::kInt || s2.codes != MmaCodes::kInt) return false;
  if (s1.bits != s2.bits || (s1.bits != 2 && s1.bits != 4 && s1.bits != 8)) return false;
  if (s1.block_size != s2.block_size) return false;
  if (s1.block_size != 0 && !pow2(s1.block_size)) return false;
  if (s2.map != MmaRowMap::kIdentity) return false;
  // Zero points with scale blocks of whole chunks gave FC1 results off the oracle on the H200
  // (GpuFused.ZeroPointsTakeTheDecodeKernel's history, bench/results/2026-12-02-h200-fused.md):
  // until that is understood, those layers keep the decode kernel.
  if ((sh.zp1 || sh.zp2) && s1.block_size != 0 && steps_per_block(s1) == 0) return false;
  if (sh.experts > kFusedMaxExperts || sh.slots > kFusedMaxSlots || sh.slots < 1) return false;
  if (sh.hidden % 8 != 0 || s2.n != sh.hidden || s2.k != sh.inter) return false;
  if (!pow2(chunk_k(s2)) || chunk_k(s2) > kFusedMaxUnits) return false;
  return fused_geometry(sh, kFusedDecodeMaxTokens, chunk_k(s2)).smem <= kFusedSmemBudget;
}

int fused_decode_units(const FusedShape& sh, int tokens) {
  const int ck = chunk_k(sh.fc2);
  const int64_t kmax = sh.fc2.chunks * ck;
  // Experts a call touches: at most its routes; a shard's held experts get about L / E of them.
  const int64_t held = sh.local_experts > 0 ? sh.local_experts : sh.experts;
  const int64_t routes = static_cast<int64_t>(tokens) * sh.slots;
  const int64_t touched = std::min<int64_t>(held, (routes * held + sh.experts - 1) / sh.experts);
  int u = ck;
  while (2 * u <= kFusedMaxUnits && 2 * u <= kmax &&
         touched * ((sh.inter + 2 * u - 1) / (2 * u)) >= kFusedTargetItems &&
         fused_geometry(sh, tokens, 2 * u).smem <= kFusedSmemBudget) {
    u *= 2;
  }
  return u;
}

size_t fused_decode_workspace_bytes(const FusedShape& sh, int tokens) {
  const int u = fused_decode_units(sh, tokens);
  const int64_t slices = (sh.inter + u - 1) / u;
  const size_t bytes = static_cast<size_t>(slices) * tokens * sh.slots * sh.hidden * 4;
  return (bytes + 255) / 256 * 256;
}

Status prepare_fused_decode() {
  for (int bits : {2, 4, 8}) {
    for (bool bf16 : {false, true}) {
      for (int spb : {0, 1, 2, 4}) {
        const void* k = kernel_for(bits, bf16, spb);
        if (k == nullptr) continue;
        QMOE_CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kFusedSmemBudget)));
      }
    }
  }
  return Status::ok();
}

Status plan_fused_decode(const FusedShape& sh, DType act_dtype, int tokens, int grid_cap,
                         FusedLaunch* out) {
  if (tokens < 1 || tokens > kFusedDecodeMaxTokens || !fused_decode_supports(sh, act_dtype)) {
    return Status::invalid("fused decode: no kernel for this layer at " + std::to_string(tokens) +
                           " tokens (fused_decode_supports, 1.." +
                           std::to_string(kFusedDecodeMaxTokens) + " tokens)");
  }
  FusedLaunch p;
  p.geo = fused_geometry(sh, tokens, fused_decode_units(sh, tokens));
  p.kernel = kernel_for(sh.fc1.bits, act_dtype == DType::kBF16, p.geo.spb);
  if (p.kernel == nullptr || p.geo.smem > kFusedSmemBudget) {
    return Status::invalid("fused decode: no kernel for this layer (fused_decode_supports)");
  }
  int device = 0, sms = 0, per_sm = 0;
  QMOE_CUDA_TRY(cudaGetDevice(&device));
  QMOE_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  QMOE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, p.kernel, kFusedWarps * 32,
                                                              p.geo.smem));
  if (per_sm < 1) return Status::internal("fused decode: the kernel does not fit a multiprocessor");
  // __launch_bounds__(kThreads, 2) and the shared-memory budget: at most two per SM.
  p.grid = sms * std::min(per_sm, 2);
  if (grid_cap > 0) p.grid = std::min(p.grid, grid_cap);
  *out = p;
  return Status::ok();
}

Status launch_fused_decode(const FusedDecodeArgs& a, const FusedLaunch& plan, cudaStream_t stream) {
  if (plan.kernel == nullptr || a.tokens < 1 || a.tokens > kFusedDecodeMaxTokens) {
    return Status::invalid("fused decode: tokens must be 1.." +
                           std::to_string(kFusedDecodeMaxTokens) + " with a plan, got " +
                           std::to_string(a.tokens));
  }
  if (a.x == nullptr || a.out == nullptr || a.partial == nullptr || a.logits == nullptr ||
      a.fc1.packed == nullptr || a.fc2.packed == nullptr || a.fc1.scales == nullptr ||
      a.fc2.scales == nullptr) {
    return Status::invalid("fused decode: null input, output, workspace or weight pointer");
  }
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return Status::invalid("fused decode: input must be 16-byte aligned");
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(plan.grid);
  cfg.blockDim = dim3(kFusedWarps * 32);
  cfg.dynamicSmemBytes = plan.geo.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  FusedDecodeArgs args = a;
  FusedGeometry g = plan.geo;
  void* params[] = {&args, &g};
  QMOE_CUDA_TRY(cudaLaunchKernelExC(&cfg, plan.kernel, params));
  QMOE_CUDA_CHECK_LAUNCH("fused_decode_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda

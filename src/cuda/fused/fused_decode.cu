// The fused decode kernel's launcher (see fused_decode.h): which layers it takes, the split,
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
size_t align256(size_t n) { return (n + 255) / 256 * 256; }

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

// Row strides of 16 halves modulo 32: the B loads of a half-warp's rows meet no bank twice
// (decode_gemv.cu's geometry()).
int pad_ld(int halves) { return halves % 32 == 0 ? halves + 16 : halves; }

// The shared-memory layout (fused_decode_kernel.cuh draws it) and the workspace offsets of a call
// of `tokens` with this split.
FusedGeometry fused_geometry(const FusedShape& sh, int tokens, FusedSplit split) {
  const MmaPackShape& s1 = sh.fc1;
  const MmaPackShape& s2 = sh.fc2;
  FusedGeometry g;
  g.kt1 = split.kt1;
  g.kt2 = split.kt2;
  g.items1 = static_cast<int>((s1.tiles + g.kt1 - 1) / g.kt1);
  g.items2 = static_cast<int>((s2.tiles + g.kt2 - 1) / g.kt2);
  const int parts1 = kFusedWarps / g.kt1, parts2 = kFusedWarps / g.kt2;
  g.cpp1 = static_cast<int>((s1.chunks + parts1 - 1) / parts1);
  g.cpp2 = static_cast<int>((s2.chunks + parts2 - 1) / parts2);
  const int rows = std::min(tokens, kFusedDecodeMaxTokens);
  g.ld1 = pad_ld(static_cast<int>(s1.chunks) * chunk_k(s1));
  g.ld2 = pad_ld(static_cast<int>(s2.chunks) * chunk_k(s2));
  g.zrow_len = (std::max(g.ld1, g.ld2) + 7) / 8 * 8;
  g.nbp1 = static_cast<int>(s1.scale_blocks);
  g.cpb1 = chunks_per_block(s1);
  g.nbp2 = static_cast<int>(s2.scale_blocks);
  g.cpb2 = chunks_per_block(s2);
  g.spb = steps_per_block(s1);
  const size_t routing_bytes = static_cast<size_t>(kFusedWarps) *
                               routing_detail::routing_warp_floats(sh.experts, sh.slots) * 4;
  // The K parts' sums (8 floats a lane) where an item splits K; the combine's slot values.
  const size_t red_bytes =
      std::max<size_t>(g.kt1 < kFusedWarps || g.kt2 < kFusedWarps ? kFusedWarps * 32 * 8 * 4 : 0,
                       static_cast<size_t>(sh.slots) * 32 * 4);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t o = off;
    off += align16(bytes);
    return static_cast<int>(o);
  };
  g.off_b = take(std::max({static_cast<size_t>(rows) * std::max(g.ld1, g.ld2) * 2, routing_bytes,
                           red_bytes}));
  g.off_zrow = take(static_cast<size_t>(g.zrow_len) * 2);
  g.off_sc1 = take(static_cast<size_t>(g.kt1) * 16 * g.nbp1 * 4);
  g.off_zs1 = take(sh.zp1 ? static_cast<size_t>(g.kt1) * 16 * g.nbp1 * 4 : 0);
  g.off_sc2 = take(static_cast<size_t>(g.kt2) * 16 * g.nbp2 * 4);
  g.off_zs2 = take(sh.zp2 ? static_cast<size_t>(g.kt2) * 16 * g.nbp2 * 4 : 0);
  // The weight rings take what the budget leaves (at least kRingMinSlots per warp, so that a
  // geometry over the budget stays over it and is refused).
  const size_t per_slot = static_cast<size_t>(kFusedWarps) * (kChunkBytes + kBarrierBytes);
  const size_t room = kFusedSmemBudget > off + 16 ? (kFusedSmemBudget - off - 16) / per_slot : 0;
  g.ring = static_cast<int>(std::clamp<size_t>(room, kRingMinSlots, kRingMaxSlots));
  g.off_ring = take(static_cast<size_t>(kFusedWarps) * g.ring * kChunkBytes);
  g.off_bars = take(static_cast<size_t>(kFusedWarps) * g.ring * kBarrierBytes);
  g.smem = off;
  // The workspace: partial sums, activations, counters.
  const size_t routes = static_cast<size_t>(tokens) * sh.slots;
  g.ws_acts = align256(routes * sh.hidden * 4);
  g.ws_ready = g.ws_acts + align256(routes * sh.inter * 2);
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
  // H and I multiples of 8: 16-byte rows of inputs and activations.
  if (sh.hidden % 8 != 0 || sh.inter % 8 != 0 || s2.n != sh.hidden || s2.k != sh.inter) {
    return false;
  }
  // The widest items (no K split) take the least shared memory.
  return fused_geometry(sh, kFusedDecodeMaxTokens, FusedSplit{kFusedWarps, kFusedWarps}).smem <=
         kFusedSmemBudget;
}

FusedSplit fused_decode_split(const FusedShape& sh, int tokens) {
  // Experts a call touches: at most its routes; a shard's held experts get about L / E of them.
  const int64_t held = sh.local_experts > 0 ? sh.local_experts : sh.experts;
  const int64_t routes = static_cast<int64_t>(tokens) * sh.slots;
  const int64_t touched = std::min<int64_t>(held, (routes * held + sh.experts - 1) / sh.experts);
  // Halve the tiles per item (doubling the K parts) while the items are too few and every part
  // keeps a chunk.
  auto pick = [&](const MmaPackShape& s) {
    int kt = kFusedWarps;
    while (kt > 1 && touched * ((s.tiles + kt - 1) / kt) < kFusedTargetItems &&
           kFusedWarps / (kt / 2) <= s.chunks) {
      kt /= 2;
    }
    return kt;
  };
  FusedSplit sp{pick(sh.fc1), pick(sh.fc2)};
  // A K split needs room for its sums: back to whole tiles where the shared memory is short.
  if (fused_geometry(sh, tokens, sp).smem > kFusedSmemBudget) sp = {kFusedWarps, kFusedWarps};
  return sp;
}

size_t fused_decode_workspace_bytes(const FusedShape& sh, int tokens) {
  const FusedGeometry g = fused_geometry(sh, tokens, FusedSplit{kFusedWarps, kFusedWarps});
  const int64_t routes = static_cast<int64_t>(tokens) * sh.slots;
  const int64_t held = sh.local_experts > 0 ? sh.local_experts : sh.experts;
  return g.ws_ready + align256(static_cast<size_t>(std::min(held, routes)) * 4);
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
  p.geo = fused_geometry(sh, tokens, fused_decode_split(sh, tokens));
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
  char* ws = reinterpret_cast<char*>(a.partial);
  args.acts = reinterpret_cast<uint16_t*>(ws + g.ws_acts);
  args.ready = reinterpret_cast<int32_t*>(ws + g.ws_ready);
  void* params[] = {&args, &g};
  QMOE_CUDA_TRY(cudaLaunchKernelExC(&cfg, plan.kernel, params));
  QMOE_CUDA_CHECK_LAUNCH("fused_decode_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda

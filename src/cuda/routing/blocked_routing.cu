// The blocked routing path, for token counts past the fused path's one block: the fused path's
// counting sort split over blocks of kBlockTokens tokens, in three kernels where the general
// path's CUB pipeline takes seven (two each for the histogram and the scan, one for the sort, the
// routing and the scatter).
//
//   route    a warp per token, kRouteTokens (a quarter of a block) per CTA: ids and weights
//            (route_warp.cuh) and, per expert, the mask of the block's tokens routed to it
//            (shared-memory atomics, order-free), each CTA writing its part (a byte) of
//            masks[b][e].
//   offsets  one block: count_e = sum over blocks of popcount(masks[b][e]), the exclusive scan
//            over experts (offsets), and each block's first position among expert e's routes,
//            base[b][e] = offsets[e] + the counts of the blocks before b; and the plan
//            (DeviceRoutingArgs::plan_*, as the fused kernel builds it) where it is asked for,
//            which saves the plan kernel's launch (stages.h launch_plan), with the grouped
//            GEMMs' group arrays (plan_setups), which saves their setup kernels.
//   place    a thread per route (t, j), expert e, block b = t / kBlockTokens:
//            position = base[b][e] + popcount(masks[b][e] & the bits of b's tokens before t);
//            with the generic path's gather (DeviceRoutingArgs::gather) a warp per token and
//            share of the row's columns, which places its routes and copies its share of the
//            input row to their positions, saving the gather kernel.
//
// A token routes to an expert at most once, so an expert's routes in route-id order are its
// tokens in order, and that position is the stable counting sort's: the maps equal
// build_expert_maps()'s bit for bit, as the other paths' do.
//
// Temporary storage (each region 256-byte aligned): masks u32 [B][E] | base i32 [B][E], with B =
// ceil(T / kBlockTokens).
#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <string>
#include <type_traits>

#include "cuda/common/cuda_check.h"
#include "cuda/common/device_numeric.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/common/sm90.h"
#include "cuda/gemm/group_setup.cuh"
#include "cuda/layer/plan_entries.cuh"
#include "cuda/routing/route_warp.cuh"
#include "cuda/routing/routing_internal.cuh"

namespace qmoe::cuda::routing_detail {
namespace {

constexpr int kBlockTokens = 32;  // a 32-bit mask per expert
// The route kernel's CTA: a warp per token, a quarter of a mask block, so that 128 tokens run on
// 16 SMs rather than 4 (a CTA of the block's 32 warps took 9.7 us at 128 tokens, about twice one
// warp's routing: its warps contend for the SM's issue slots).
constexpr int kRouteTokens = 8;
constexpr int kRouteParts = kBlockTokens / kRouteTokens;  // CTAs per mask block
static_assert(kRouteTokens % 8 == 0 && kBlockTokens % kRouteTokens == 0,
              "each CTA owns whole bytes of the mask words (no two CTAs write one byte)");
constexpr int kRouteThreads = kRouteTokens * kWarpSize;
constexpr int kOffsetThreads = 1024;
constexpr int kPlaceThreads = 256;
static_assert(kFusedMaxExperts <= kOffsetThreads, "one offsets thread per expert");
struct BlockedLayout {
  int64_t blocks = 0;
  size_t masks = 0, base = 0, total = 0;  // byte offsets and size
};

BlockedLayout blocked_layout(int64_t tokens, int64_t experts) {
  BlockedLayout l;
  l.blocks = (tokens + kBlockTokens - 1) / kBlockTokens;
  const size_t entries = static_cast<size_t>(l.blocks * experts);
  l.masks = 0;
  l.base = align_routing_temp(entries * sizeof(uint32_t));
  l.total = l.base + align_routing_temp(entries * sizeof(int32_t));
  return l;
}

template <RoutingMethod kMethod>
__global__ void __launch_bounds__(kRouteThreads)
    blocked_route_kernel(TokenRouting a, int64_t tokens, uint32_t* masks) {
  extern __shared__ float rows[];  // [kRouteTokens][routing_warp_floats(E, slots)]
  __shared__ uint32_t s_mask[kFusedMaxExperts];
  pdl_wait();     // the logits, and the workspace the previous call's kernels may still read
  pdl_trigger();  // the offsets kernel may launch: it waits for this one's end itself
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int num_e = a.experts;
  for (int e = tid; e < num_e; e += kRouteThreads) s_mask[e] = 0u;
  __syncthreads();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteTokens + warp;
  if (t < tokens) {  // warp-uniform
    float* x = rows + static_cast<size_t>(warp) * routing_warp_floats(num_e, a.slots);
    int32_t* sids = reinterpret_cast<int32_t*>(x + 2 * num_e);
    route_token_warp<kMethod>(a, t, x, x + num_e, sids, x + 2 * num_e + a.slots, lane);
    for (int j = lane; j < a.slots; j += kWarpSize) atomicOr(&s_mask[sids[j]], 1u << warp);
  }
  __syncthreads();
  // This CTA's part of each mask word masks[b][e] (little-endian: part p holds the bits of the
  // block's tokens from p kRouteTokens on); every part of every block is some CTA's, tokens or
  // none.
  using Part = std::conditional_t<kRouteTokens == 8, uint8_t,
                                  std::conditional_t<kRouteTokens == 16, uint16_t, uint32_t>>;
  const int64_t b = blockIdx.x / kRouteParts;
  const int part = static_cast<int>(blockIdx.x % kRouteParts);
  Part* out = reinterpret_cast<Part*>(masks + b * num_e) + part;
  for (int e = tid; e < num_e; e += kRouteThreads) {
    out[static_cast<int64_t>(e) * kRouteParts] = static_cast<Part>(s_mask[e]);
  }
}

// The plan's outputs and its experts (DeviceRoutingArgs::plan_*; touched null: no plan).
struct BlockedPlan {
  int32_t* touched = nullptr;
  int32_t* n_touched = nullptr;
  int32_t* tile_start = nullptr;
  int32_t* ready = nullptr;
  int tile_m = 128;
  int first = 0, experts = 0;
  GroupSetup setups[DeviceRoutingArgs::kMaxPlanSetups];  // the GEMMs' group arrays
  int setup_count = 0;
};

__global__ void __launch_bounds__(kOffsetThreads)
    blocked_offsets_kernel(const uint32_t* masks, int64_t blocks, int experts, int32_t routes,
                           int32_t* counts, int32_t* offsets, int32_t* base, BlockedPlan plan) {
  using Scan = cub::BlockScan<int32_t, kOffsetThreads>;
  using PlanScan = cub::BlockScan<int2, kOffsetThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ typename PlanScan::TempStorage plan_tmp;
  pdl_wait();
  pdl_trigger();
  const int e = static_cast<int>(threadIdx.x);
  int32_t c = 0;
  if (e < experts) {
    for (int64_t b = 0; b < blocks; ++b) c += __popc(masks[b * experts + e]);
  }
  int32_t before = 0;
  Scan(tmp).ExclusiveSum(c, before);
  if (plan.touched != nullptr) {  // uniform; every thread takes part in the scan
    // Planned expert pe = e - first: (touched or not, its tiles), scanned to its index in the
    // touched list and its first tile; the untouched fill the list from its end with -1.
    const int pe = e - plan.first;
    const bool planned = pe >= 0 && pe < plan.experts;
    const int2 mine =
        make_int2(planned && c > 0 ? 1 : 0, planned ? (c + plan.tile_m - 1) / plan.tile_m : 0);
    int2 prefix, total;
    PlanScan(plan_tmp).ExclusiveScan(
        mine, prefix, make_int2(0, 0),
        [](const int2& a, const int2& b) { return make_int2(a.x + b.x, a.y + b.y); }, total);
    if (planned) {
      store_plan_entry(plan.touched, plan.tile_start, plan.ready, plan.experts, pe, c, prefix.x,
                       prefix.y);
      // The GEMMs' group slots (group_setup.h, as its setup kernel fills them from this plan):
      // a touched expert's at its index, an untouched one's (no rows, expert 0's pointers) at
      // the entry the plan gives its -1.
      const int slot = c > 0 ? prefix.x : plan.experts - 1 - (pe - prefix.x);
#pragma unroll  // constant indices: the parameter's setups stay out of local memory
      for (int i = 0; i < DeviceRoutingArgs::kMaxPlanSetups; ++i) {
        if (i < plan.setup_count && slot < plan.setups[i].max_groups) {
          write_group_slot(plan.setups[i], slot, c > 0 ? pe : 0, c > 0 ? before : 0, c);
        }
      }
    }
    if (e == 0) store_plan_end(plan.n_touched, plan.tile_start, total.x, total.y);
  }
  if (e >= experts) return;
  counts[e] = c;
  offsets[e] = before;
  if (e == 0) offsets[experts] = routes;
  int32_t run = before;
  for (int64_t b = 0; b < blocks; ++b) {
    base[b * experts + e] = run;
    run += __popc(masks[b * experts + e]);
  }
}

// Route r = (t, j)'s position, base[b][e] + popcount(masks[b][e] & the bits of b's tokens before
// t), stored both ways (permuted[position] = r, position[r]) when `store`.
__device__ __forceinline__ int32_t place_route(const int32_t* ids, const uint32_t* masks,
                                               const int32_t* base, int experts, int64_t t,
                                               int64_t r, int32_t* permuted, int32_t* position,
                                               bool store = true) {
  const int64_t at = (t / kBlockTokens) * experts + ids[r];
  const int in_block = static_cast<int>(t % kBlockTokens);
  const uint32_t earlier = in_block == 0 ? 0u : (~0u >> (32 - in_block));
  const int32_t pos = base[at] + __popc(masks[at] & earlier);
  if (store) {
    permuted[pos] = static_cast<int32_t>(r);
    position[r] = pos;
  }
  return pos;
}

__global__ void blocked_place_kernel(const int32_t* ids, const uint32_t* masks, const int32_t* base,
                                     int experts, int slots, int32_t routes, int32_t* permuted,
                                     int32_t* position) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= routes) return;
  place_route(ids, masks, base, experts, r / slots, r, permuted, position);
}

constexpr int kGatherWarps = 8;  // tokens per block of the place-and-gather kernel
// 16-byte pieces of the row a lane loads before it stores them: the loads go out together
// rather than each behind the previous piece's stores (which may alias them, for all the
// compiler knows); a 2048-wide bf16 row's share is at most one round.
constexpr int kGatherPieces = 8;
// CTAs the place-and-gather kernel aims for: with few tokens their rows are split by columns
// (blockIdx.y), since 16 CTAs of 8 warps (128 tokens) wrote their 4 MiB at 0.5 TB/s (8.4 us).
constexpr int64_t kGatherCtas = 256;

// 16-byte pieces of the padded row each column share takes (a multiple of a warp's 32) and so
// the shares per row: enough to give about kGatherCtas CTAs.
int64_t gather_share(int64_t token_blocks, int64_t ld8) {
  const int64_t want = std::max<int64_t>(1, (kGatherCtas + token_blocks - 1) / token_blocks);
  const int64_t share = (ld8 + want - 1) / want;
  return (share + kWarpSize - 1) / kWarpSize * kWarpSize;
}

// blocked_place_kernel with the generic path's gather (DeviceRoutingArgs::gather) folded in: a
// warp per token t and column share blockIdx.y (`share` 16-byte pieces of the padded row). Lanes
// j < slots find route (t, j)'s position (the first share's CTAs store it, as
// blocked_place_kernel does); then the warp reads its share of t's input row once and writes it
// to each of the token's positions, zero padded to ld, recording a non-finite value as
// launch_gather does.
//
//   row t:  | share 0 (y = 0) | share 1 (y = 1) | ... | last share, to ld (zeros past hidden) |
//   each share -> out[pos(t, j)] for j < slots
__global__ void __launch_bounds__(kGatherWarps* kWarpSize)
    blocked_place_gather_kernel(const int32_t* ids, const uint32_t* masks, const int32_t* base,
                                int experts, int slots, int64_t tokens, int32_t* permuted,
                                int32_t* position, DeviceRoutingArgs::Gather g, int64_t share) {
  __shared__ int32_t s_pos[kGatherWarps][kFusedMaxSlots];
  pdl_wait();
  pdl_trigger();
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kGatherWarps + warp;
  if (t >= tokens) return;  // warp-uniform
  if (lane < slots) {
    s_pos[warp][lane] = place_route(ids, masks, base, experts, t, t * slots + lane, permuted,
                                    position, blockIdx.y == 0);
  }
  __syncwarp();
  const int64_t hidden8 = g.hidden / 8, ld8 = g.ld / 8;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * share;
  const int64_t end = begin + share < ld8 ? begin + share : ld8;
  const uint4* src = static_cast<const uint4*>(g.input) + t * hidden8;
  uint4* out = static_cast<uint4*>(g.out);
  bool bad = false;
  for (int64_t c0 = begin + lane; c0 < end; c0 += kGatherPieces * kWarpSize) {
    uint4 v[kGatherPieces];
#pragma unroll
    for (int u = 0; u < kGatherPieces; ++u) {
      const int64_t c = c0 + u * kWarpSize;
      v[u] = c < end && c < hidden8 ? __ldg(src + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGatherPieces; ++u) {
      const int64_t c = c0 + u * kWarpSize;
      if (c >= end) break;
      bad |= nonfinite16x8(v[u], g.bf16);
      for (int j = 0; j < slots; ++j) out[s_pos[warp][j] * ld8 + c] = v[u];
    }
  }
  if (bad) {
    atomicOr(g.error, g.error_bit);
    atomicMin(g.error + 1, static_cast<int32_t>(t));
  }
}

}  // namespace

size_t blocked_path_temp_bytes(int64_t tokens, int64_t experts) {
  return blocked_layout(tokens, experts).total;
}

Status launch_blocked_routing(const DeviceRoutingArgs& args, void* temp, size_t temp_bytes,
                              cudaStream_t stream) {
  const int slots = args.routing.top_k + args.routing.num_shared;
  const int num_e = args.num_experts;
  const BlockedLayout l = blocked_layout(args.tokens, num_e);
  if (temp == nullptr || temp_bytes < l.total) {
    return Status::invalid("temp: " + std::to_string(temp == nullptr ? 0 : temp_bytes) +
                           " bytes; expected at least " + std::to_string(l.total) +
                           " (general_routing_temp_bytes for " + std::to_string(args.tokens) +
                           " tokens)");
  }
  if (args.tokens == 0) return Status::ok();
  char* base_ptr = static_cast<char*>(temp);
  uint32_t* masks = reinterpret_cast<uint32_t*>(base_ptr + l.masks);
  int32_t* base = reinterpret_cast<int32_t*>(base_ptr + l.base);
  const RouteMapsView& m = args.maps;
  const int32_t routes = static_cast<int32_t>(args.tokens * slots);
  // Up to 8 warps x (2 x 512 + 2 x 16) floats = 33 KiB (with the static masks past 48 KiB the
  // kernel would need the opt-in, as the fused kernel does).
  const size_t smem =
      static_cast<size_t>(kRouteTokens) * routing_warp_floats(num_e, slots) * sizeof(float);
  QMOE_RETURN_IF_ERROR(with_routing_method(args.routing.method, [&](auto method) -> Status {
    auto* kernel = &blocked_route_kernel<decltype(method)::value>;
    if (smem + kFusedMaxExperts * sizeof(uint32_t) > kSm90SmemDefaultPerBlock) {
      QMOE_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
    }
    QMOE_CUDA_TRY(launch_maybe_pdl(kernel, dim3(static_cast<unsigned>(l.blocks * kRouteParts)),
                                   dim3(kRouteThreads), smem, stream, args.pdl, token_routing(args),
                                   args.tokens, masks));
    QMOE_CUDA_CHECK_LAUNCH("blocked_route_kernel");
    return Status::ok();
  }));
  BlockedPlan plan;
  if (args.plan_touched != nullptr) {
    plan.touched = args.plan_touched;
    plan.n_touched = args.plan_n_touched;
    plan.tile_start = args.plan_tile_start;
    plan.ready = args.plan_ready;
    plan.tile_m = args.plan_tile_m;
    plan.first = args.plan_first;
    plan.experts = args.plan_experts > 0 ? args.plan_experts : num_e;
    plan.setup_count = args.plan_setup_count;
    for (int i = 0; i < args.plan_setup_count; ++i) plan.setups[i] = args.plan_setups[i];
  }
  QMOE_CUDA_TRY(launch_maybe_pdl(&blocked_offsets_kernel, dim3(1), dim3(kOffsetThreads), 0, stream,
                                 args.pdl, masks, l.blocks, num_e, routes, m.expert_counts,
                                 m.expert_offsets, base, plan));
  QMOE_CUDA_CHECK_LAUNCH("blocked_offsets_kernel");
  if (args.gather.input != nullptr) {
    const int64_t blocks = (args.tokens + kGatherWarps - 1) / kGatherWarps;
    const int64_t ld8 = args.gather.ld / 8, share = gather_share(blocks, ld8);
    const dim3 grid(static_cast<unsigned>(blocks),
                    static_cast<unsigned>((ld8 + share - 1) / share));
    QMOE_CUDA_TRY(launch_maybe_pdl(&blocked_place_gather_kernel, grid,
                                   dim3(kGatherWarps * kWarpSize), 0, stream, args.pdl,
                                   m.expert_ids, masks, base, num_e, slots, args.tokens,
                                   m.permuted_route, m.route_position, args.gather, share));
    QMOE_CUDA_CHECK_LAUNCH("blocked_place_gather_kernel");
    return Status::ok();
  }
  QMOE_CUDA_TRY(launch_maybe_pdl(
      &blocked_place_kernel, dim3(static_cast<unsigned>((routes + kPlaceThreads - 1) / kPlaceThreads)),
      dim3(kPlaceThreads), 0, stream, args.pdl, m.expert_ids, masks, base, num_e, slots, routes,
      m.permuted_route, m.route_position));
  QMOE_CUDA_CHECK_LAUNCH("blocked_place_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda::routing_detail

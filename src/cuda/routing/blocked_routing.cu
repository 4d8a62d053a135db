// The blocked routing path, for token counts past the fused path's one block: the fused path's
// counting sort split over blocks of kBlockTokens tokens, in three kernels where the general
// path's CUB pipeline takes seven (two each for the histogram and the scan, one for the sort, the
// routing and the scatter).
//
//   route    one block per kBlockTokens tokens, a warp per token: ids and weights (route_warp.cuh)
//            and, per expert, the mask of the block's tokens routed to it (shared-memory atomics,
//            order-free), written to masks[b][e].
//   offsets  one block: count_e = sum over blocks of popcount(masks[b][e]), the exclusive scan
//            over experts (offsets), and each block's first position among expert e's routes,
//            base[b][e] = offsets[e] + the counts of the blocks before b; and the plan
//            (DeviceRoutingArgs::plan_*, as the fused kernel builds it) where it is asked for,
//            which saves the plan kernel's launch (stages.h launch_plan).
//   place    a thread per route (t, j), expert e, block b = t / kBlockTokens:
//            position = base[b][e] + popcount(masks[b][e] & the bits of b's tokens before t).
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

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/common/sm90.h"
#include "cuda/layer/plan_entries.cuh"
#include "cuda/routing/route_warp.cuh"
#include "cuda/routing/routing_internal.cuh"

namespace qmoe::cuda::routing_detail {
namespace {

constexpr int kBlockTokens = 32;  // one warp per token, a 32-bit mask per expert
constexpr int kRouteThreads = kBlockTokens * kWarpSize;
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
  extern __shared__ float rows[];  // [kBlockTokens][routing_warp_floats(E, slots)]
  __shared__ uint32_t s_mask[kFusedMaxExperts];
  pdl_wait();     // the logits, and the workspace the previous call's kernels may still read
  pdl_trigger();  // the offsets kernel may launch: it waits for this one's end itself
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int num_e = a.experts;
  for (int e = tid; e < num_e; e += kRouteThreads) s_mask[e] = 0u;
  __syncthreads();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kBlockTokens + warp;
  if (t < tokens) {  // warp-uniform
    float* x = rows + static_cast<size_t>(warp) * routing_warp_floats(num_e, a.slots);
    int32_t* sids = reinterpret_cast<int32_t*>(x + 2 * num_e);
    route_token_warp<kMethod>(a, t, x, x + num_e, sids, x + 2 * num_e + a.slots, lane);
    for (int j = lane; j < a.slots; j += kWarpSize) atomicOr(&s_mask[sids[j]], 1u << warp);
  }
  __syncthreads();
  uint32_t* out = masks + static_cast<int64_t>(blockIdx.x) * num_e;
  for (int e = tid; e < num_e; e += kRouteThreads) out[e] = s_mask[e];
}

// The plan's outputs and its experts (DeviceRoutingArgs::plan_*; touched null: no plan).
struct BlockedPlan {
  int32_t* touched = nullptr;
  int32_t* n_touched = nullptr;
  int32_t* tile_start = nullptr;
  int32_t* ready = nullptr;
  int tile_m = 128;
  int first = 0, experts = 0;
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

__global__ void blocked_place_kernel(const int32_t* ids, const uint32_t* masks, const int32_t* base,
                                     int experts, int slots, int32_t routes, int32_t* permuted,
                                     int32_t* position) {
  pdl_wait();
  pdl_trigger();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= routes) return;
  const int64_t t = r / slots;
  const int64_t at = (t / kBlockTokens) * experts + ids[r];
  const int in_block = static_cast<int>(t % kBlockTokens);
  const uint32_t earlier = in_block == 0 ? 0u : (~0u >> (32 - in_block));
  const int32_t pos = base[at] + __popc(masks[at] & earlier);
  permuted[pos] = static_cast<int32_t>(r);
  position[r] = pos;
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
  // Up to 32 warps x (2 x 512 + 2 x 16) floats = 132 KiB: past 48 KiB with the static masks the
  // kernel needs the opt-in, as the fused kernel does.
  const size_t smem =
      static_cast<size_t>(kBlockTokens) * routing_warp_floats(num_e, slots) * sizeof(float);
  QMOE_RETURN_IF_ERROR(with_routing_method(args.routing.method, [&](auto method) -> Status {
    auto* kernel = &blocked_route_kernel<decltype(method)::value>;
    if (smem + kFusedMaxExperts * sizeof(uint32_t) > kSm90SmemDefaultPerBlock) {
      QMOE_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
    }
    QMOE_CUDA_TRY(launch_maybe_pdl(kernel, dim3(static_cast<unsigned>(l.blocks)),
                                   dim3(kRouteThreads), smem, stream, args.pdl,
                                   token_routing(args), args.tokens, masks));
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
  }
  QMOE_CUDA_TRY(launch_maybe_pdl(&blocked_offsets_kernel, dim3(1), dim3(kOffsetThreads), 0, stream,
                                 args.pdl, masks, l.blocks, num_e, routes, m.expert_counts,
                                 m.expert_offsets, base, plan));
  QMOE_CUDA_CHECK_LAUNCH("blocked_offsets_kernel");
  QMOE_CUDA_TRY(launch_maybe_pdl(
      &blocked_place_kernel, dim3(static_cast<unsigned>((routes + kPlaceThreads - 1) / kPlaceThreads)),
      dim3(kPlaceThreads), 0, stream, args.pdl, m.expert_ids, masks, base, num_e, slots, routes,
      m.permuted_route, m.route_position));
  QMOE_CUDA_CHECK_LAUNCH("blocked_place_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda::routing_detail

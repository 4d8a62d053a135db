// The fused routing path: one block routes up to kFusedMaxTokens tokens (each of its routing
// warps takes tokens warp, warp + 32, ...) and builds the expert maps and the plan in shared
// memory, so a decode step pays one launch for routing.
//
// The maps equal build_expert_maps()'s. A token routes to an expert at most once, so an expert's
// routes in route-id order are its tokens in order: the block keeps one 64-bit token mask per
// expert (integer atomics, order-free); an expert's count is the mask's popcount, its offset the
// exclusive block scan of the counts, and route (t, j)'s position offset[id] + popcount(mask[id]
// & (2^t - 1)) -- the stable counting sort's position.
#include <cub/block/block_scan.cuh>

#include "cuda/common/cuda_check.h"
#include "cuda/routing/route_warp.cuh"
#include "cuda/routing/routing_internal.cuh"

namespace qmoe::cuda::routing_detail {
namespace {

constexpr int kFusedThreads = 1024;
constexpr int kFusedWarps = kFusedThreads / kWarpSize;
static_assert(kFusedMaxExperts <= kFusedThreads, "one thread per expert");
static_assert(kFusedMaxTokens * kFusedMaxSlots <= kFusedThreads, "one thread per route");
static_assert(kFusedMaxTokens <= 64, "token masks are 64-bit");

template <RoutingMethod kMethod>
__global__ void __launch_bounds__(kFusedThreads)
    fused_routing_kernel(TokenRouting a, int tokens, int routing_warps, int32_t* counts,
                         int32_t* offsets, int32_t* permuted, int32_t* position,
                         int32_t* plan_touched, int32_t* plan_n_touched, int32_t* plan_tile_start,
                         int plan_tile_m) {
  extern __shared__ float rows[];  // [routing_warps][routing_warp_floats(E, slots)]
  using Scan = cub::BlockScan<int32_t, kFusedThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ unsigned long long s_mask[kFusedMaxExperts];
  __shared__ int32_t s_offset[kFusedMaxExperts];
  __shared__ int32_t s_ids[kFusedMaxTokens * kFusedMaxSlots];  // the routes' experts
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int num_e = a.experts;
  const int slots = a.slots;
  if (tid < num_e) s_mask[tid] = 0ull;
  __syncthreads();

  if (warp < routing_warps) {
    float* x = rows + static_cast<size_t>(warp) * routing_warp_floats(num_e, slots);
    int32_t* sids = reinterpret_cast<int32_t*>(x + 2 * num_e);
    for (int t = warp; t < tokens; t += routing_warps) {
      route_token_warp<kMethod>(a, t, x, x + num_e, sids, x + 2 * num_e + slots, lane);
      for (int j = lane; j < slots; j += kWarpSize) {
        s_ids[t * slots + j] = sids[j];
        atomicOr(&s_mask[sids[j]], 1ull << t);
      }
      __syncwarp();  // the next token rewrites sids
    }
  }
  __syncthreads();  // masks and ids complete

  const int32_t c = tid < num_e ? __popcll(s_mask[tid]) : 0;
  int32_t o = 0;
  Scan(scan_storage).ExclusiveSum(c, o);
  if (tid < num_e) {
    s_offset[tid] = o;
    counts[tid] = c;
    offsets[tid] = o;
  }
  const int routes = tokens * slots;
  if (tid == 0) offsets[num_e] = routes;
  if (plan_touched != nullptr) {
    // The plan: touched flag in the low 16 bits, tiles in the high (at most 512 experts and 1024
    // routes, so neither field overflows), one scan for both prefixes.
    const int32_t f = c > 0 ? 1 + (((c + plan_tile_m - 1) / plan_tile_m) << 16) : 0;
    int32_t fo = 0, total = 0;
    __syncthreads();  // scan_storage is reused
    Scan(scan_storage).ExclusiveSum(f, fo, total);
    if (c > 0) {
      plan_touched[fo & 0xFFFF] = tid;
      plan_tile_start[fo & 0xFFFF] = fo >> 16;
    }
    if (tid == 0) {
      *plan_n_touched = total & 0xFFFF;
      plan_tile_start[total & 0xFFFF] = total >> 16;
    }
  }
  __syncthreads();
  if (tid < routes) {
    const int t = tid / slots;
    const int32_t id = s_ids[tid];  // not a.ids: a read back from L2 costs a round trip
    const unsigned long long earlier = t == 0 ? 0ull : (~0ull >> (64 - t));
    const int32_t pos = s_offset[id] + __popcll(s_mask[id] & earlier);
    permuted[pos] = tid;
    position[tid] = pos;
  }
}

}  // namespace

Status launch_fused_routing(const DeviceRoutingArgs& args, cudaStream_t stream) {
  const int tokens = static_cast<int>(args.tokens);
  const int slots = args.routing.top_k + args.routing.num_shared;
  const int routing_warps = tokens < kFusedWarps ? (tokens > 0 ? tokens : 1) : kFusedWarps;
  const size_t smem = static_cast<size_t>(routing_warps) *
                      routing_warp_floats(static_cast<int>(args.num_experts), slots) *
                      sizeof(float);
  // Up to 32 warps x (2 x 512 + 2 x 16) floats = 132 KiB. Beyond 48 KiB, static and dynamic
  // together, the kernel needs the opt-in; the static part (masks, offsets, ids, CUB's scan
  // storage) is read from the compiled kernel once.
  return with_routing_method(args.routing.method, [&](auto method) -> Status {
    auto* kernel = &fused_routing_kernel<decltype(method)::value>;
    static const size_t static_bytes = [kernel] {
      cudaFuncAttributes fa{};
      return cudaFuncGetAttributes(&fa, kernel) == cudaSuccess ? fa.sharedSizeBytes
                                                               : size_t{48 * 1024};
    }();
    if (smem + static_bytes > 48 * 1024) {
      QMOE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    }
    const RouteMapsView& m = args.maps;
    kernel<<<1, kFusedThreads, smem, stream>>>(
        token_routing(args), tokens, routing_warps, m.expert_counts, m.expert_offsets,
        m.permuted_route, m.route_position, args.plan_touched, args.plan_n_touched,
        args.plan_tile_start, args.plan_tile_m);
    QMOE_CUDA_CHECK_LAUNCH("fused_routing_kernel");
    return Status::ok();
  });
}

}  // namespace qmoe::cuda::routing_detail

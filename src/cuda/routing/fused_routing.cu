// The fused routing path: one block routes up to kFusedMaxTokens tokens (each of its routing
// warps takes tokens warp, warp + 32, ...) and builds the expert maps and the plan in shared
// memory, so a decode step pays one launch for routing.
//
// The maps equal build_expert_maps()'s. A token routes to an expert at most once, so an expert's
// routes in route-id order are its tokens in order: the block keeps one 64-bit token mask per
// expert (integer atomics, order-free); an expert's count is the mask's popcount, its offset the
// exclusive block scan of the counts, and route (t, j)'s position offset[id] + popcount(mask[id]
// & (2^t - 1)) -- the stable counting sort's position.
#include <cstdint>

#include "cuda/common/cuda_check.h"
#include "cuda/common/pdl.cuh"
#include "cuda/common/sm90.h"
#include "cuda/common/stamps.cuh"
#include "cuda/common/stamps.h"
#include "cuda/layer/plan_entries.cuh"
#include "cuda/routing/route_warp.cuh"
#include "cuda/routing/routing_internal.cuh"

namespace qmoe::cuda::routing_detail {
namespace {

constexpr int kFusedThreads = 1024;
constexpr int kFusedWarps = kFusedThreads / kWarpSize;
static_assert(kFusedMaxExperts <= kFusedThreads, "one thread per expert");
static_assert(kFusedMaxTokens * kFusedMaxSlots <= kFusedThreads, "one thread per route");
static_assert(kFusedMaxTokens <= 64, "token masks are 64-bit");

// One block scan gives the offsets and both plan prefixes: expert e's count, touched flag and
// tiles packed into one word, [0, 11) count, [11, 21) touched, [21, 32) tiles. No field carries
// into the next: at most 1024 routes, so at most 1024 tiles (an expert's tiles <= its count), and
// 512 experts.
constexpr int kScanWarps = kFusedMaxExperts / kWarpSize;  // the warps of the experts' threads
constexpr int kTouchedShift = 11;
constexpr int kTilesShift = 21;
static_assert(kFusedMaxTokens * kFusedMaxSlots < (1 << kTouchedShift), "routes fit 11 bits");
static_assert(kFusedMaxExperts < (1 << (kTilesShift - kTouchedShift)), "experts fit 10 bits");
static_assert(kFusedMaxTokens * kFusedMaxSlots < (1 << (32 - kTilesShift)), "tiles fit 11 bits");

// The exclusive prefix of v over the block's first kScanWarps warps (every thread calls it;
// the other warps get 0) and, in *total, the sum of all: a shuffle scan per warp, then one warp
// scans the warps' sums. Two barriers, a few dozen instructions.
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, int warp, int lane,
                                                         uint32_t* s_warp, uint32_t* total) {
  uint32_t inc = v;
  if (warp < kScanWarps) {
#pragma unroll
    for (int off = 1; off < kWarpSize; off *= 2) {
      const uint32_t y = __shfl_up_sync(kFullMask, inc, off);
      if (lane >= off) inc += y;
    }
    if (lane == kWarpSize - 1) s_warp[warp] = inc;
  }
  __syncthreads();
  if (warp == 0) {
    const uint32_t w = lane < kScanWarps ? s_warp[lane] : 0u;
    uint32_t winc = w;
#pragma unroll
    for (int off = 1; off < kWarpSize; off *= 2) {
      const uint32_t y = __shfl_up_sync(kFullMask, winc, off);
      if (lane >= off) winc += y;
    }
    if (lane < kScanWarps) s_warp[lane] = winc - w;  // exclusive
    if (lane == kWarpSize - 1) s_warp[kScanWarps] = winc;
  }
  __syncthreads();
  *total = s_warp[kScanWarps];
  return warp < kScanWarps ? s_warp[warp] + inc - v : 0u;
}

template <RoutingMethod kMethod>
__global__ void __launch_bounds__(kFusedThreads)
    fused_routing_kernel(TokenRouting a, int tokens, int routing_warps, int32_t* counts,
                         int32_t* offsets, int32_t* permuted, int32_t* position,
                         int32_t* plan_touched, int32_t* plan_n_touched, int32_t* plan_tile_start,
                         int32_t* plan_ready, int plan_tile_m, int plan_first, int plan_experts) {
  extern __shared__ float rows[];  // [routing_warps][routing_warp_floats(E, slots)]
  __shared__ uint32_t s_warp_scan[kScanWarps + 1];
  __shared__ unsigned long long s_mask[kFusedMaxExperts];
  __shared__ int32_t s_offset[kFusedMaxExperts];
  __shared__ int32_t s_ids[kFusedMaxTokens * kFusedMaxSlots];  // the routes' experts
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int num_e = a.experts;
  const int slots = a.slots;
  QMOE_STAMP_SCOPE(0);
  pdl_wait();     // the logits, and the workspace the previous call's kernels may still read
  pdl_trigger();  // FC1 may launch: it waits for this kernel's end before reading the maps
  QMOE_STAMP_WAITED(0);
  if (tid < num_e) s_mask[tid] = 0ull;
  __syncthreads();

  if (warp < routing_warps) {
    float* x = rows + static_cast<size_t>(warp) * routing_warp_floats(num_e, slots);
    int32_t* sids = reinterpret_cast<int32_t*>(x + 2 * num_e);
    for (int t = warp; t < tokens; t += routing_warps) {
      route_token_warp<kMethod>(a, t, x, x + num_e, sids, x + 2 * num_e + slots, lane);
      QMOE_NO_UNROLL  // slots <= 16: one pass
          for (int j = lane; j < slots; j += kWarpSize) {
        s_ids[t * slots + j] = sids[j];
        atomicOr(&s_mask[sids[j]], 1ull << t);
      }
      __syncwarp();  // the next token rewrites sids
    }
  }
  __syncthreads();  // masks and ids complete

  const int32_t c = tid < num_e ? __popcll(s_mask[tid]) : 0;
  // The plan counts only its experts [plan_first, plan_first + plan_experts) (local experts);
  // the offsets count every expert's routes.
  const int plan_e = tid - plan_first;
  const bool planned = plan_touched != nullptr && plan_e >= 0 && plan_e < plan_experts;
  const uint32_t tiles = planned ? static_cast<uint32_t>((c + plan_tile_m - 1) / plan_tile_m) : 0u;
  const uint32_t packed = static_cast<uint32_t>(c) |
                          ((planned && c > 0 ? 1u : 0u) << kTouchedShift) | (tiles << kTilesShift);
  uint32_t total = 0;
  const uint32_t before = block_exclusive_scan(packed, warp, lane, s_warp_scan, &total);
  const int32_t o = static_cast<int32_t>(before & ((1u << kTouchedShift) - 1));
  if (tid < num_e) {
    s_offset[tid] = o;
    counts[tid] = c;
    offsets[tid] = o;
  }
  const int routes = tokens * slots;
  if (tid == 0) offsets[num_e] = routes;
  if (plan_touched != nullptr) {
    const uint32_t touched_mask = (1u << (kTilesShift - kTouchedShift)) - 1;
    if (planned) {  // the planned touched experts before this one, and their tiles
      store_plan_entry(plan_touched, plan_tile_start, plan_ready, plan_experts, plan_e, c,
                       static_cast<int32_t>((before >> kTouchedShift) & touched_mask),
                       static_cast<int32_t>(before >> kTilesShift));
    }
    if (tid == 0) {
      store_plan_end(plan_n_touched, plan_tile_start,
                     static_cast<int32_t>((total >> kTouchedShift) & touched_mask),
                     static_cast<int32_t>(total >> kTilesShift));
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
                                                               : kSm90SmemDefaultPerBlock;
    }();
    if (smem + static_bytes > kSm90SmemDefaultPerBlock) {
      QMOE_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
    }
    const RouteMapsView& m = args.maps;
    QMOE_CUDA_TRY(launch_maybe_pdl(kernel, dim3(1), dim3(kFusedThreads), smem, stream, args.pdl,
                                   token_routing(args), tokens, routing_warps, m.expert_counts,
                                   m.expert_offsets, m.permuted_route, m.route_position,
                                   args.plan_touched, args.plan_n_touched, args.plan_tile_start,
                                   args.plan_ready, args.plan_tile_m, args.plan_first,
                                   args.plan_experts > 0 ? args.plan_experts : args.num_experts));
    QMOE_CUDA_CHECK_LAUNCH("fused_routing_kernel");
    return Status::ok();
  });
}

}  // namespace qmoe::cuda::routing_detail

#if defined(QMOE_STAMPS)
namespace qmoe::cuda {
QMOE_STAMPS_EXPORT(stamps_take_routing)
}  // namespace qmoe::cuda
#endif

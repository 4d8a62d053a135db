// The fused routing path: one block routes up to kFusedMaxTokens tokens (warp t routes token t)
// and builds the expert maps in shared memory, so a decode step pays one launch for routing.
//
// The maps equal build_expert_maps()'s: counts by integer atomics (order-free), offsets by an
// exclusive block scan, and route r's position = offsets[id] + the number of earlier routes with
// the same id, which is the stable counting sort's position. With at most 128 routes the
// quadratic count is cheaper than anything cleverer.
#include <cub/block/block_scan.cuh>

#include "cuda/common/cuda_check.h"
#include "cuda/routing/route_warp.cuh"
#include "cuda/routing/routing_internal.cuh"

namespace qmoe::cuda::routing_detail {
namespace {

constexpr int kFusedThreads = kFusedMaxTokens * kWarpSize;
constexpr int kCountsPerThread = kFusedMaxExperts / kFusedThreads;
constexpr int kFusedMaxRoutes = kFusedMaxTokens * kFusedMaxSlots;
static_assert(kCountsPerThread * kFusedThreads == kFusedMaxExperts, "experts per thread");
static_assert(kFusedMaxRoutes <= kFusedThreads, "one thread per route");

__global__ void __launch_bounds__(kFusedThreads)
    fused_routing_kernel(TokenRouting a, int tokens, int32_t* counts, int32_t* offsets,
                         int32_t* permuted, int32_t* position, int32_t* plan_touched,
                         int32_t* plan_n_touched, int32_t* plan_tile_start, int plan_tile_m) {
  extern __shared__ float rows[];  // [tokens][2 E]: each routing warp's x and work
  using Scan = cub::BlockScan<int32_t, kFusedThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int32_t s_count[kFusedMaxExperts];
  __shared__ int32_t s_offset[kFusedMaxExperts];
  __shared__ int32_t s_ids[kFusedMaxRoutes];

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int num_e = a.experts;
  for (int e = tid; e < num_e; e += kFusedThreads) s_count[e] = 0;
  if (warp < tokens) {
    float* x = rows + static_cast<size_t>(warp) * routing_warp_floats(num_e, a.slots);
    route_token_warp(a, warp, x, x + num_e, reinterpret_cast<int32_t*>(x + 2 * num_e),
                     x + 2 * num_e + a.slots, lane);
  }
  __syncthreads();  // also makes the warps' global writes of ids visible to the block

  const int routes = tokens * a.slots;
  if (tid < routes) {
    const int32_t id = a.ids[tid];
    s_ids[tid] = id;
    atomicAdd(&s_count[id], 1);
  }
  __syncthreads();

  int32_t c[kCountsPerThread];
  int32_t o[kCountsPerThread];
#pragma unroll
  for (int i = 0; i < kCountsPerThread; ++i) {
    const int e = tid * kCountsPerThread + i;
    c[i] = e < num_e ? s_count[e] : 0;
  }
  Scan(scan_storage).ExclusiveSum(c, o);
#pragma unroll
  for (int i = 0; i < kCountsPerThread; ++i) {
    const int e = tid * kCountsPerThread + i;
    if (e < num_e) {
      s_offset[e] = o[i];
      counts[e] = c[i];
      offsets[e] = o[i];
    }
  }
  if (tid == 0) offsets[num_e] = routes;
  if (plan_touched != nullptr) {
    // The plan: touched flag in the low 16 bits, tiles in the high (at most 512 experts and 128
    // routes, so neither field overflows), one scan for both prefixes.
    int32_t f[kCountsPerThread], fo[kCountsPerThread];
#pragma unroll
    for (int i = 0; i < kCountsPerThread; ++i) {
      f[i] = c[i] > 0 ? 1 + (((c[i] + plan_tile_m - 1) / plan_tile_m) << 16) : 0;
    }
    __syncthreads();  // scan_storage is reused
    int32_t total = 0;
    Scan(scan_storage).ExclusiveSum(f, fo, total);
#pragma unroll
    for (int i = 0; i < kCountsPerThread; ++i) {
      const int e = tid * kCountsPerThread + i;
      if (e < num_e && c[i] > 0) {
        plan_touched[fo[i] & 0xFFFF] = e;
        plan_tile_start[fo[i] & 0xFFFF] = fo[i] >> 16;
      }
    }
    if (tid == 0) {
      *plan_n_touched = total & 0xFFFF;
      plan_tile_start[total & 0xFFFF] = total >> 16;
    }
  }
  __syncthreads();

  if (tid < routes) {
    const int32_t id = s_ids[tid];
    int32_t rank = 0;
    for (int q = 0; q < tid; ++q) rank += s_ids[q] == id ? 1 : 0;
    const int32_t pos = s_offset[id] + rank;
    permuted[pos] = tid;
    position[tid] = pos;
  }
}

}  // namespace

Status launch_fused_routing(const DeviceRoutingArgs& args, cudaStream_t stream) {
  const int tokens = static_cast<int>(args.tokens);
  // At most 8 warps x (2 x 512 + 2 x 16) floats = 33 KiB: within the default 48 KiB.
  const size_t smem =
      static_cast<size_t>(tokens) *
      routing_warp_floats(args.num_experts, args.routing.top_k + args.routing.num_shared) *
      sizeof(float);
  const RouteMapsView& m = args.maps;
  fused_routing_kernel<<<1, kFusedThreads, smem, stream>>>(
      token_routing(args), tokens, m.expert_counts, m.expert_offsets, m.permuted_route,
      m.route_position, args.plan_touched, args.plan_n_touched, args.plan_tile_start,
      args.plan_tile_m);
  QMOE_CUDA_CHECK_LAUNCH("fused_routing_kernel");
  return Status::ok();
}

}  // namespace qmoe::cuda::routing_detail

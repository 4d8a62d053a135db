// The general routing path: a warp per token writes ids and weights (and the route ids the sort
// carries), then CUB builds the maps. Every map is integer data, so the device-wide primitives
// give exactly build_expert_maps()'s result: the histogram counts, the exclusive scan of the
// counts gives the offsets, and a radix sort of (expert id, route id) pairs, stable by
// construction, lists the routes of each expert in route-id order.
//
// Temporary storage, each region 256-byte aligned:
//   CUB's storage (the largest of the three primitives' needs; they run one after another on
//   the stream, so they share it) | sorted keys u32 [R] | route ids i32 [R]      (R = T * slots)
#include <algorithm>
#include <cub/device/device_histogram.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/common/sm90.h"
#include "cuda/routing/route_warp.cuh"
#include "cuda/routing/routing_internal.cuh"

namespace qmoe::cuda {
namespace routing_detail {
namespace {

// Warps per routing block: as many as fit the default 48 KiB of shared memory (2 E floats each,
// at most 8); from E = 6145 on a single warp needs the opt-in (at most 128 KiB at E = 16384).
constexpr int kMaxWarpsPerBlock = 8;
constexpr size_t kDefaultSmem = kSm90SmemDefaultPerBlock;
constexpr int kScatterThreads = 256;

// Key bits the radix sort needs for ids in [0, experts).
int expert_key_bits(int experts) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < experts) ++bits;
  return bits;
}

struct TempLayout {
  size_t cub_bytes = 0;  // at offset 0
  size_t keys = 0;       // offset of the sorted keys
  size_t route_ids = 0;  // offset of the route ids
  size_t total = 0;
};

Status temp_layout(int64_t tokens, int slots, int64_t experts, TempLayout* l) {
  const int routes = static_cast<int>(tokens * slots);
  const int num_e = static_cast<int>(experts);
  size_t hist = 0, scan = 0, sort = 0;
  QMOE_CUDA_TRY(cub::DeviceHistogram::HistogramEven(
      nullptr, hist, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      num_e + 1, 0, num_e, routes));
  QMOE_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const int32_t*>(nullptr),
                                              static_cast<int32_t*>(nullptr), num_e));
  QMOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
      nullptr, sort, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), routes, 0,
      expert_key_bits(num_e)));
  const size_t items = align_routing_temp(static_cast<size_t>(routes) * sizeof(int32_t));
  l->cub_bytes = align_routing_temp(std::max(hist, std::max(scan, sort)));
  l->keys = l->cub_bytes;
  l->route_ids = l->keys + items;
  l->total = l->route_ids + items;
  return Status::ok();
}

template <RoutingMethod kMethod>
__global__ void route_tokens_kernel(TokenRouting a, int64_t tokens, int warps_per_block,
                                    int32_t* route_ids) {
  extern __shared__ float rows[];  // [warps_per_block][2 E]
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * warps_per_block + warp;
  if (t >= tokens) return;  // warp-uniform; the kernel has no block barrier
  float* x = rows + static_cast<size_t>(warp) * routing_warp_floats(a.experts, a.slots);
  route_token_warp<kMethod>(a, t, x, x + a.experts, reinterpret_cast<int32_t*>(x + 2 * a.experts),
                            x + 2 * a.experts + a.slots, lane);
  const int64_t first = t * a.slots;
  for (int j = lane; j < a.slots; j += kWarpSize) {
    route_ids[first + j] = static_cast<int32_t>(first + j);
  }
}

// route_position = the inverse of permuted_route; offsets[E] = R (the scan covers [0, E)).
__global__ void scatter_positions_kernel(const int32_t* permuted, int32_t routes, int32_t* position,
                                         int32_t* offsets, int experts) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p == 0) offsets[experts] = routes;
  if (p < routes) position[permuted[p]] = static_cast<int32_t>(p);
}

// Launches route_tokens_kernel with as many warps per block as fit the default shared memory,
// opting in to more for a single warp when E needs it.
Status launch_route_tokens(const DeviceRoutingArgs& args, int32_t* route_ids, cudaStream_t stream) {
  if (args.tokens == 0) return Status::ok();
  const size_t row_bytes =
      routing_warp_floats(args.num_experts, args.routing.top_k + args.routing.num_shared) *
      sizeof(float);
  const int warps = static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(kMaxWarpsPerBlock, kDefaultSmem / row_bytes)));
  const size_t smem = row_bytes * warps;
  if (smem > kDefaultSmem) {
    int device = 0;
    int optin = 0;
    QMOE_CUDA_TRY(cudaGetDevice(&device));
    QMOE_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (smem > static_cast<size_t>(optin)) {
      return Status::unsupported("num_experts: " + std::to_string(args.num_experts) +
                                 " experts need " + std::to_string(smem) +
                                 " bytes of shared memory per token; this device allows " +
                                 std::to_string(optin));
    }
  }
  const int64_t blocks = (args.tokens + warps - 1) / warps;
  return with_routing_method(args.routing.method, [&](auto method) -> Status {
    auto* kernel = &route_tokens_kernel<decltype(method)::value>;
    if (smem > kDefaultSmem) {
      QMOE_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
    }
    kernel<<<static_cast<unsigned>(blocks), warps * kWarpSize, smem, stream>>>(
        token_routing(args), args.tokens, warps, route_ids);
    QMOE_CUDA_CHECK_LAUNCH("route_tokens_kernel");
    return Status::ok();
  });
}

}  // namespace

Status launch_general_routing(const DeviceRoutingArgs& args, void* temp, size_t temp_bytes,
                              cudaStream_t stream) {
  const int slots = args.routing.top_k + args.routing.num_shared;
  const int routes = static_cast<int>(args.tokens * slots);
  const int num_e = static_cast<int>(args.num_experts);
  TempLayout l;
  QMOE_RETURN_IF_ERROR(temp_layout(args.tokens, slots, args.num_experts, &l));
  if (temp == nullptr || temp_bytes < l.total) {
    return Status::invalid("temp: " + std::to_string(temp == nullptr ? 0 : temp_bytes) +
                           " bytes; expected at least " + std::to_string(l.total) +
                           " (general_routing_temp_bytes for " + std::to_string(args.tokens) +
                           " tokens)");
  }
  char* base = static_cast<char*>(temp);
  void* cub_temp = base;
  size_t cub_bytes = l.cub_bytes;
  uint32_t* sorted_keys = reinterpret_cast<uint32_t*>(base + l.keys);
  int32_t* route_ids = reinterpret_cast<int32_t*>(base + l.route_ids);
  const RouteMapsView& m = args.maps;

  QMOE_RETURN_IF_ERROR(launch_route_tokens(args, route_ids, stream));
  QMOE_CUDA_TRY(cub::DeviceHistogram::HistogramEven(
      cub_temp, cub_bytes, m.expert_ids, m.expert_counts, num_e + 1, 0, num_e, routes, stream));
  cub_bytes = l.cub_bytes;
  QMOE_CUDA_TRY(cub::DeviceScan::ExclusiveSum(cub_temp, cub_bytes, m.expert_counts,
                                              m.expert_offsets, num_e, stream));
  cub_bytes = l.cub_bytes;
  QMOE_CUDA_TRY(cub::DeviceRadixSort::SortPairs(
      cub_temp, cub_bytes, reinterpret_cast<const uint32_t*>(m.expert_ids), sorted_keys, route_ids,
      m.permuted_route, routes, 0, expert_key_bits(num_e), stream));
  const int blocks = std::max(1, (routes + kScatterThreads - 1) / kScatterThreads);
  scatter_positions_kernel<<<blocks, kScatterThreads, 0, stream>>>(
      m.permuted_route, routes, m.route_position, m.expert_offsets, num_e);
  QMOE_CUDA_CHECK_LAUNCH("scatter_positions_kernel");
  return Status::ok();
}

}  // namespace routing_detail

Status general_path_temp_bytes(int64_t tokens, int slots, int64_t experts, size_t* bytes) {
  if (bytes == nullptr) return Status::invalid("bytes: null");
  *bytes = 0;
  QMOE_RETURN_IF_ERROR(routing_detail::check_routing_sizes(tokens, slots, experts));
  routing_detail::TempLayout l;
  QMOE_RETURN_IF_ERROR(routing_detail::temp_layout(tokens, slots, experts, &l));
  *bytes = l.total;
  return Status::ok();
}

}  // namespace qmoe::cuda

// Routing internals shared by the routing translation units and the GPU tests: the two paths
// behind launch_routing(), callable one by one so that tests can run the general path on token
// counts the fused path would take. Host declarations only (includable from plain C++).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/routing/device_routing.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

enum class RoutingPath { kAuto, kFused, kBlocked, kGeneral };

// The routing temp's alignment, and each of its regions' (the blocked and general layouts).
constexpr size_t kRoutingTempAlign = 256;
constexpr size_t align_routing_temp(size_t bytes) {
  return (bytes + kRoutingTempAlign - 1) / kRoutingTempAlign * kRoutingTempAlign;
}

// Bytes of temporary storage the general path needs for T tokens, whether or not the fused path
// would apply (general_routing_temp_bytes() is this, or 0 where the fused path applies).
Status general_path_temp_bytes(int64_t tokens, int slots, int64_t experts, size_t* bytes);

// launch_routing() with the path chosen by the caller: kAuto is launch_routing() itself; kFused
// and kBlocked are refused (kInvalidArgument) where fused_routing_applies() or
// blocked_routing_applies() is false; kBlocked needs general_routing_temp_bytes() of temporary
// storage, kGeneral general_path_temp_bytes().
Status launch_routing_path(const DeviceRoutingArgs& args, RoutingPath path, void* temp,
                           size_t temp_bytes, cudaStream_t stream);

namespace routing_detail {

// kInvalidArgument unless tokens >= 0, 1 <= slots, 1 <= experts <= kGeneralMaxExperts and
// tokens * slots fits int32 route ids.
Status check_routing_sizes(int64_t tokens, int slots, int64_t experts);

// Lets `kernel` launch with up to `smem` bytes of dynamic shared memory on the current device. The
// attribute is the kernel's, shared by every thread's calls (one layer may run from several
// threads), so it only ever grows: a call that needs less never lowers it between another
// thread's setting and launch.
Status allow_dynamic_smem(const void* kernel, size_t smem);

// The launchers behind launch_routing_path(), for validated arguments.
Status launch_fused_routing(const DeviceRoutingArgs& args, cudaStream_t stream);
Status launch_general_routing(const DeviceRoutingArgs& args, void* temp, size_t temp_bytes,
                              cudaStream_t stream);
Status launch_blocked_routing(const DeviceRoutingArgs& args, void* temp, size_t temp_bytes,
                              cudaStream_t stream);
// The blocked path's temporary storage for T tokens (blocked_routing.cu's layout).
size_t blocked_path_temp_bytes(int64_t tokens, int64_t experts);

}  // namespace routing_detail
}  // namespace qmoe::cuda

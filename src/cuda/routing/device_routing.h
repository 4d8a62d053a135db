// Routing on the device, bit for bit equal to the host's route() (src/core/routing/): the same
// per-token arithmetic (route_token.h semantics, compiled with -fmad=false), the same selection
// order, and the same expert maps (stable by route id).
//
// Three paths, chosen by the token count:
//   fused   (T <= kFusedMaxTokens, E <= kFusedMaxExperts, top_k + shared <= kFusedMaxSlots): one
//           block routes every token (up to 32 routing warps, a token at a time each) and builds
//           counts, offsets, the permuted route order and its inverse in shared memory from
//           per-expert token masks. Needs no temporary storage.
//   blocked (T <= kBlockedMaxTokens, the fused path's E and slot limits): the same counting sort
//           over blocks of 32 tokens in three kernels (blocked_routing.cu): route with per-block
//           expert masks, one block for the offsets and each block's base, a thread per route
//           for its position.
//   general (any T): a warp per token writes ids and weights; CUB builds the maps (a histogram for
//           the counts, an exclusive scan for the offsets, a stable radix sort of (expert, route
//           id) pairs for the permuted order) and a scatter kernel the inverse.
// Temporary storage: general_routing_temp_bytes(), which covers the blocked and general paths.
//
// Non-finite logits or router weights cannot be reported synchronously from the device. A token
// carrying one is routed as if its logits were all zero (so every id stays in range), its weights
// become NaN (so its output row is NaN, never a silently wrong number), and the error word records
// it: error[0] |= 1 (router_probs) or 2 (router_weights), error[1] = min(error[1], token).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gemm/group_setup.h"
#include "qmoe/layer.h"
#include "qmoe/routing.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

constexpr int kFusedMaxTokens = 64;
constexpr int kFusedMaxExperts = 512;
constexpr int kFusedMaxSlots = 16;
// Tokens the blocked path takes (its offsets kernel walks T / 32 blocks per expert).
constexpr int64_t kBlockedMaxTokens = 16384;
// Experts the general path supports (its per-warp shared memory holds 2 E floats).
constexpr int kGeneralMaxExperts = 16384;

enum RoutingErrorBits : int32_t { kErrorLogits = 1, kErrorRouterWeights = 2 };

struct DeviceRoutingArgs {
  RoutingSpec routing;
  int num_experts = 0;           // E: router columns, shared experts included
  int64_t tokens = 0;            // T
  const void* logits = nullptr;  // device [T, E], logits_dtype (f32, f16 or bf16)
  DType logits_dtype = DType::kF32;
  const void* router_weights = nullptr;  // optional device [T, E], rw_dtype
  DType rw_dtype = DType::kF32;
  const float* router_bias = nullptr;  // device f32 [E - num_shared], kGroupedTopK only
  RouteMapsView maps;                  // device arrays (carve_route_maps on device memory)
  int32_t* error = nullptr;            // device int32[2], see above; never reset here
  // Optional, fused and blocked paths (routing_builds_plan()): the generic path's plan (stages.h
  // launch_plan) built by the routing's own kernels, saving a launch per call: touched experts
  // ascending (then -1 up to entry E - 1, as launch_plan leaves them), their number, and
  // tile_start over them (exclusive prefix of ceil(count / plan_tile_m)). Ignored when null or
  // when the general path runs; the caller then runs launch_plan itself.
  int32_t* plan_touched = nullptr;
  int32_t* plan_n_touched = nullptr;
  int32_t* plan_tile_start = nullptr;
  int plan_tile_m = 128;
  // Optional, with the plan: one counter per planned expert, zeroed (the decode kernels' FC1 ->
  // FC2 counters, DecodeFcArgs::ready).
  int32_t* plan_ready = nullptr;
  // The plan's experts: [plan_first, plan_first + plan_experts) of the E (0: all E). A layer
  // holding local experts plans its own only, numbered from 0 (touched entries are e -
  // plan_first, the list runs to entry plan_experts - 1); the maps still cover all E routes.
  int plan_first = 0;
  int plan_experts = 0;
  // Optional, with the plan, blocked path only (routing_writes_setups()): up to two grouped
  // GEMMs' group arrays (group_setup.h: each touched expert's slot, rows and first row), written
  // by the kernel that plans the experts, so that the GEMMs launch without their setup kernels
  // (MixedGemmArgs::setup_written). Each max_groups is at most the plan's experts.
  static constexpr int kMaxPlanSetups = 2;
  GroupSetup plan_setups[kMaxPlanSetups];
  int plan_setup_count = 0;
  // Optional, blocked path only: the generic path's gather (stages.h launch_gather) in the kernel
  // that places the routes, so that it needs no kernel of its own: out[p, 0:ld) = input[token of
  // route p, :], zero padded from hidden to ld, in 16-byte pieces (bf16 or f16 rows, hidden and
  // ld multiples of 8, input and out 16-byte aligned); a non-finite input value ORs error_bit
  // into error[0] and lowers error[1] to its token. Ignored where input is null.
  struct Gather {
    const void* input = nullptr;
    bool bf16 = true;
    int64_t hidden = 0;
    void* out = nullptr;
    int64_t ld = 0;
    int32_t* error = nullptr;
    int32_t error_bit = 0;
  } gather;
  // Fused path: launch with programmatic dependent launch (pdl.cuh). The kernel waits for the
  // stream's previous kernel before it reads or writes anything, and lets the next kernel (FC1,
  // which waits for it in turn) launch at once, so that FC1's blocks are resident and ready when
  // the routing ends instead of being launched then.
  bool pdl = false;
};

bool fused_routing_applies(int64_t tokens, int slots, int64_t experts);
bool blocked_routing_applies(int64_t tokens, int slots, int64_t experts);
// Whether launch_routing (the automatic path) builds the plan asked for in DeviceRoutingArgs:
// the fused or the blocked path runs.
bool routing_builds_plan(int64_t tokens, int slots, int64_t experts);
// Whether launch_routing writes DeviceRoutingArgs::plan_setups and runs its gather: the blocked
// path runs.
bool routing_writes_setups(int64_t tokens, int slots, int64_t experts);

// Bytes of temporary storage routing needs for T tokens: 0 when the fused path applies, else the
// larger of the blocked path's need at min(T, kBlockedMaxTokens) (where its E and slot limits
// allow it) and the general path's at T, so that the size never decreases with T across the
// paths' boundary. A pure function of its arguments on a given device (CUB's own size queries, no
// launches).
Status general_routing_temp_bytes(int64_t tokens, int slots, int64_t experts, size_t* bytes);

// Fills args.maps (expert_ids, weights, expert_counts, expert_offsets, permuted_route,
// route_position; maps.tokens is set on the host view only) on `stream`. Asynchronous: no host
// synchronization, no allocation; capturable in a CUDA graph. `temp` holds temp_bytes >=
// general_routing_temp_bytes(T, ...) bytes, 256-byte aligned (unused on the fused path).
Status launch_routing(const DeviceRoutingArgs& args, void* temp, size_t temp_bytes,
                      cudaStream_t stream);

}  // namespace qmoe::cuda

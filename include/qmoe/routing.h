// qmoe: routing. route() turns router logits into RouteMaps, the one structure every backend
// shares. Its arithmetic is written with explicit fused multiply-adds and a fixed summation order
// (src/core/routing/) so the CUDA backend reproduces it bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe {

// Views into one caller-provided buffer (see route_maps_bytes / carve_route_maps).
// A route is (token t, slot j), id r = t * slots + j. Slots [0, top_k) are routed experts in
// selection order (descending weight before any renormalization); slots [top_k, slots) are the
// shared experts in index order.
struct RouteMapsView {
  int64_t tokens = 0;
  int slots = 0;
  int64_t experts = 0;
  int32_t* expert_ids = nullptr;      // [T * slots]
  float* weights = nullptr;           // [T * slots]
  int32_t* expert_counts = nullptr;   // [E]: routes per expert
  int32_t* expert_offsets = nullptr;  // [E + 1]: exclusive prefix sum of expert_counts
  int32_t* permuted_route = nullptr;  // [T * slots]: route id at each position, sorted by expert,
                                      //   stable by route id (so by token, then slot)
  int32_t* route_position = nullptr;  // [T * slots]: inverse of permuted_route
  float* scratch = nullptr;           // [2 * E]: per-token working space of route()
};

// Bytes for the maps of `tokens` tokens (each array 64-byte aligned, sizes rounded up to 64).
// 0 when a size is negative or T * slots or E exceeds the int32 range of route ids and offsets.
size_t route_maps_bytes(int64_t tokens, int slots, int64_t experts);
// Lays the arrays out in `buffer`, which must be 64-byte aligned and route_maps_bytes() long.
// A null or misaligned buffer (or invalid sizes) gives a view with null arrays, which route()
// rejects.
RouteMapsView carve_route_maps(void* buffer, int64_t tokens, int slots, int64_t experts);

// Routes in.router_logits (and in.router_weights if present) per spec.routing into maps, which must
// have been carved for at least T tokens (T = router_logits.dims[0]); maps->tokens becomes T.
// router_bias: f32 [E - num_shared] for kGroupedTopK, else ignored. Everything routing reads is
// validated: NaN/Inf logits or router weights are an error naming the input, token and expert.
// On error the maps' contents are unspecified. The semantics of each method: docs/routing.md.
Status route(const LayerSpec& spec, const RunInputs& in, const TensorView& router_bias,
             RouteMapsView* maps);

// Builds counts, offsets, permuted_route and route_position from expert_ids[0, tokens * slots)
// alone (a stable counting sort); every id must lie in [0, experts). Exposed so tests can check it
// independently of the routing arithmetic.
void build_expert_maps(RouteMapsView* maps);

}  // namespace qmoe

// RouteMaps storage and the expert-order maps built from the routing result.
//
// One buffer, each array starting on a 64-byte boundary:
//   expert_ids i32 [R] | weights f32 [R] | expert_counts i32 [E] | expert_offsets i32 [E + 1] |
//   permuted_route i32 [R] | route_position i32 [R] | scratch f32 [2 E]          (R = T * slots)
#include <cstdint>
#include <limits>

#include "qmoe/routing.h"

namespace qmoe {

namespace {

constexpr size_t kAlign = 64;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct Layout {
  size_t ids, weights, counts, offsets, permuted, position, scratch, total;
};

// False when the sizes are negative or exceed what int32 route ids and offsets can index.
bool make_layout(int64_t tokens, int slots, int64_t experts, Layout* l) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (tokens < 0 || slots < 0 || experts < 0 || experts >= kMax) return false;
  if (slots > 0 && tokens > kMax / slots) return false;
  const size_t r = static_cast<size_t>(tokens) * static_cast<size_t>(slots);
  const size_t e = static_cast<size_t>(experts);
  size_t at = 0;
  auto place = [&at](size_t bytes) {
    const size_t start = at;
    at += aligned(bytes);
    return start;
  };
  l->ids = place(r * sizeof(int32_t));
  l->weights = place(r * sizeof(float));
  l->counts = place(e * sizeof(int32_t));
  l->offsets = place((e + 1) * sizeof(int32_t));
  l->permuted = place(r * sizeof(int32_t));
  l->position = place(r * sizeof(int32_t));
  l->scratch = place(2 * e * sizeof(float));
  l->total = at;
  return true;
}

}  // namespace

size_t route_maps_bytes(int64_t tokens, int slots, int64_t experts) {
  Layout l;
  return make_layout(tokens, slots, experts, &l) ? l.total : 0;
}

RouteMapsView carve_route_maps(void* buffer, int64_t tokens, int slots, int64_t experts) {
  RouteMapsView v;
  Layout l;
  if (buffer == nullptr || reinterpret_cast<uintptr_t>(buffer) % kAlign != 0 ||
      !make_layout(tokens, slots, experts, &l)) {
    return v;  // null arrays: route() reports the maps as not carved
  }
  char* b = static_cast<char*>(buffer);
  v.tokens = tokens;
  v.slots = slots;
  v.experts = experts;
  v.expert_ids = reinterpret_cast<int32_t*>(b + l.ids);
  v.weights = reinterpret_cast<float*>(b + l.weights);
  v.expert_counts = reinterpret_cast<int32_t*>(b + l.counts);
  v.expert_offsets = reinterpret_cast<int32_t*>(b + l.offsets);
  v.permuted_route = reinterpret_cast<int32_t*>(b + l.permuted);
  v.route_position = reinterpret_cast<int32_t*>(b + l.position);
  v.scratch = reinterpret_cast<float*>(b + l.scratch);
  return v;
}

// A stable counting sort of route ids by expert. expert_counts doubles as the per-expert write
// cursor (starting at each offset) and is restored from the offsets at the end.
void build_expert_maps(RouteMapsView* maps) {
  const int64_t routes = maps->tokens * maps->slots;
  const int64_t experts = maps->experts;
  int32_t* counts = maps->expert_counts;
  int32_t* offsets = maps->expert_offsets;
  for (int64_t e = 0; e < experts; ++e) counts[e] = 0;
  for (int64_t r = 0; r < routes; ++r) ++counts[maps->expert_ids[r]];
  offsets[0] = 0;
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + counts[e];
  for (int64_t e = 0; e < experts; ++e) counts[e] = offsets[e];
  for (int64_t r = 0; r < routes; ++r) {
    const int32_t pos = counts[maps->expert_ids[r]]++;
    maps->permuted_route[pos] = static_cast<int32_t>(r);
    maps->route_position[r] = pos;
  }
  for (int64_t e = 0; e < experts; ++e) counts[e] = offsets[e + 1] - offsets[e];
}

}  // namespace qmoe

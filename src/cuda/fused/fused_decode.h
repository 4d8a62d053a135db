// The fused decode kernel: one persistent, cooperative launch per layer call that routes, runs FC1,
// the activation and FC2 of every touched expert, and combines, with no other kernel. For small
// calls (up to kFusedDecodeMaxTokens tokens) of integer layers the decode kernel reads (int2, int4,
// int8; see fused_decode_supports()).
//
//   every CTA        routes all the call's tokens itself (route_warp.cuh, bit for bit route()) and
//                    builds the expert maps in shared memory: no routing kernel, no maps in memory
//   FC1 items        (touched expert u, kt1 of its FC1 tiles), all of K split into kFusedWarps / kt1
//                    parts: activations into the workspace, then ready[u] += 1 (release)
//   FC2 items        (touched expert u, kt2 of its FC2 tiles, i.e. output rows), all of K: their
//                    weights stream in at once, then they wait for ready[u] = FC1 items per
//                    expert (acquire) and read the activations; sums by route into `partial`
//                    CTA c takes items c, c + G, ... of [FC1 items..., FC2 items...]
//   grid.sync()      (cooperative groups: the barrier's state is the driver's, not the workspace)
//                    once per CTA before its first count or wait (CTA 0 clears the counters
//                    before it), and once before the combine
//   combine          out[t, c] = sum over slots j (slot order) of w_j (partial[t slots + j][c] +
//                    b2[e_j, c]); the CTAs share the columns. Local experts: only the held experts
//                    are touched, other shards' slots are skipped
//
// The workspace (fused_decode_workspace_bytes; each part 256-byte aligned):
//     partial [T * slots][H] fp32           route id r = t * slots + j
//     acts    [T * slots][I] bf16/f16       by position in the expert-major order (maps.offset)
//     ready   [min(E, T * slots)] int32     cleared by CTA 0 before the grid's first barrier
// Each entry is written by exactly one item, whatever CTA runs it, and every sum has a fixed order,
// so a call's bits do not depend on the grid size or on scheduling. kt1 and kt2 depend on the
// call's token count and the layer only (fused_decode_split), never on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/formats/mma_pack.h"
#include "cuda/routing/device_routing.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

constexpr int kFusedDecodeMaxTokens = 16;  // routes per expert <= 16: two mma column groups

struct FusedFc {
  MmaPackShape shape;
  const uint32_t* packed = nullptr;  // [L, words_per_expert] (mma_pack.h), L local experts
  const uint8_t* scales = nullptr;   // tile order, in scale_dtype
  DType scale_dtype = DType::kF32;
  const uint8_t* zero_points = nullptr;  // tile order, a byte each, or nullptr
  const void* bias = nullptr;            // FC1: [L, fc1 rows]; FC2: [L, H]; or nullptr
  DType bias_dtype = DType::kF32;
};

struct FusedDecodeArgs {
  // Routing (the inputs of launch_routing(); maps are built in shared memory only).
  RoutingSpec routing;
  int experts = 0;  // E, shared experts included
  // Local experts: the weights hold [first_expert, first_expert + local_experts) of the E (0: all);
  // routes to other experts add nothing.
  int first_expert = 0, local_experts = 0;
  int slots = 0;   // top_k + num_shared
  int tokens = 0;  // T, 1..kFusedDecodeMaxTokens
  const void* logits = nullptr;
  DType logits_dtype = DType::kF32;
  const void* router_weights = nullptr;
  DType rw_dtype = DType::kF32;
  const float* router_bias = nullptr;  // kGroupedTopK

  FusedFc fc1, fc2;
  DType dtype = DType::kBF16;  // activations (input, FC1's output): bf16 or f16
  ActivationSpec act;
  bool scale_input = false;  // CombineMode::kScaleInput
  int64_t hidden = 0, inter = 0;
  const void* x = nullptr;  // input [T, H]
  void* out = nullptr;      // [T, H] in out_dtype
  DType out_dtype = DType::kBF16;
  float* partial = nullptr;  // workspace, fused_decode_workspace_bytes() (launch derives the rest)
  uint16_t* acts = nullptr;   // FC1's activations, in the workspace
  int32_t* ready = nullptr;   // per touched expert: FC1 items done, in the workspace
  int32_t* error = nullptr;  // the layer's error record (device_routing.h, stages.h)
  // Profiling only (RunProfile): each CTA's kFusedStamps %globaltimer readings, or nullptr.
  unsigned long long* stamps = nullptr;
};

// A CTA's stamps (ns): instants, and the summed durations of its items' phases.
enum FusedStamp : int {
  kStampStart,      // the CTA's first instruction
  kStampRouted,     // routing and maps done
  kStampFc1Ns,      // FC1 items: staging, the dot products, the activation (sum)
  kStampFc2Ns,      // FC2 items: staging, the wait for the expert's FC1, the dot products (sum)
  kStampItemsDone,  // before grid.sync()
  kStampSynced,     // after grid.sync()
  kStampEnd,        // the combine done
  kFusedStamps
};

// What the split, the shared memory and the workspace depend on: the layer's packed FCs.
struct FusedShape {
  MmaPackShape fc1, fc2;
  bool zp1 = false, zp2 = false;  // zero points
  int experts = 0, slots = 0;
  int local_experts = 0;  // the experts the weights hold (0: all E)
  int64_t hidden = 0, inter = 0;
};

// Whether the fused kernel takes a layer of this shape: integer codes of 2, 4 or 8 bits, the same
// width and scale-block size (a power of two, or per channel) for both FCs, bf16/f16 activations,
// E <= 512 experts, slots <= 16, and a call of 16 tokens fits two CTAs' shared memory per SM.
bool fused_decode_supports(const FusedShape& shape, DType act_dtype);

// Tiles per item (kt1 for FC1, kt2 for FC2; K parts kFusedWarps / kt) for a call of `tokens`: the
// widest items that still give kFusedTargetItems items of each FC (a device-independent count)
// and fit the shared memory, so that a call's bits depend on the layer and the token count only.
struct FusedSplit {
  int kt1 = 0, kt2 = 0;
};
FusedSplit fused_decode_split(const FusedShape& shape, int tokens);

// The workspace the partial sums, the activations and the counters take (256-byte multiple).
size_t fused_decode_workspace_bytes(const FusedShape& shape, int tokens);

// Byte offsets into the dynamic shared memory and the strides (fused_decode_kernel.cuh draws it).
struct FusedGeometry {
  int kt1 = 1, kt2 = 1;          // tiles per item
  int items1 = 0, items2 = 0;    // items per touched expert
  int cpp1 = 0, cpp2 = 0;        // chunks per K part
  int ld1 = 0, ld2 = 0, zrow_len = 0;
  int nbp1 = 1, cpb1 = 1;        // FC1: scale blocks per row (whole K), chunks per block
  int nbp2 = 1, cpb2 = 1;        // FC2 likewise
  int off_b = 0, off_zrow = 0, off_sc1 = 0, off_zs1 = 0, off_sc2 = 0, off_zs2 = 0;
  // Weight-ring slots per warp: what the budget leaves, kRingMinSlots..kRingMaxSlots.
  int ring = 0;
  int off_ring = 0, off_bars = 0;
  size_t smem = 0;
  int spb = 0;  // steps per scale block when blocks are shorter than a chunk, else 0
  size_t ws_acts = 0, ws_ready = 0;  // workspace byte offsets from `partial`
};

// What a call of one token count launches on one device: derived once per layer and token count
// at prepare (plan_fused_decode), so that a call only fills in its pointers.
struct FusedLaunch {
  const void* kernel = nullptr;
  int grid = 0;  // CTAs: as many as the device holds at once (two per SM), or fewer (grid_cap)
  FusedGeometry geo;
};

// Once per device, outside capture: the instantiations' shared-memory opt-in.
Status prepare_fused_decode();

// The launch of a call of `tokens` on the current device; grid_cap > 0 caps its CTAs (tests of
// grid independence). kInvalidArgument where fused_decode_supports() is false.
Status plan_fused_decode(const FusedShape& shape, DType act_dtype, int tokens, int grid_cap,
                         FusedLaunch* out);

// Launches the call planned by `plan` (plan_fused_decode for args.tokens) on `stream`:
// asynchronous, capturable, no device query.
Status launch_fused_decode(const FusedDecodeArgs& args, const FusedLaunch& plan,
                           cudaStream_t stream);

}  // namespace qmoe::cuda

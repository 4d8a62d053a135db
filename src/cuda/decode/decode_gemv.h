// The decode kernel for integer weights (int2, int3, int4, int8; symmetric or with zero points; per
// channel or blocks of 16, 32, ...), FP4 (NVFP4, MXFP4: E2M1 codes decoded to exact bf16/f16
// pairs, fp4_pair in decode_common.cuh) and FP8 (fp8, fp8_block: e4m3 codes, fp8_pair): one FC of
// every touched expert, each expert's weights read once per call whatever the number of routes that
// chose it (calls of up to kDecodeMaxRoutes tokens, so up to that many routes per expert).
//
// A block owns one or several consecutive 16-row tiles of one expert (its 4 warps split K of one
// tile, or each takes a share of the tiles). Each warp streams its part of the codes, 16 bytes
// per lane per chunk (one load, or four / two for int4 / int8's step-major chunks; mma_pack.h),
// turns them into exact (q - zp) bf16/f16 A fragments with a shift, a mask, an OR with a float's
// exponent bits and one subtraction, and multiplies them with the routes' activations (B, 8
// routes per mma, staged in shared memory) on tensor cores, accumulating in fp32. Scales are
// applied per block to the fp32 sums, so the weights are never rounded to the activation dtype
// (summation order differs from the CPU backend: results are within tolerance, not bitwise; the
// order is fixed, so a call is deterministic). Up to 16 routes run in one pass; an expert with
// more runs several passes over its weights (the later ones mostly from L2). The 4 warps' partial
// sums are added in a fixed order.
//   FC1: the epilogue adds the bias, applies the activation (gated units come as (gate, linear)
//        pairs in one thread, see MmaRowMap) and stores the activation in the dtype.
//   FC2: stores fp32 results by route position; finalize sums them per token. Or, on calls of
//        a token or two (DecodeFcArgs::combine), a cluster of blocks holds a token's routes and
//        its first block does the finalize kernel's sum itself.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/formats/mma_pack.h"
#include "cuda/layer/stages.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// The largest call (in tokens, so in routes per expert: a token routes to an expert at most once)
// the decode kernel takes; larger calls go down the generic path. The kernel itself has no such
// bound (an expert with more routes than a pass holds takes more passes over its weights); this
// one bounds what the dispatch offers and the tests cover. Which calls inside it the analytic
// default gives the decode kernel is dispatch.h's rule.
constexpr int kDecodeMaxRoutes = 4096;

struct DecodeFcArgs {
  MmaPackShape shape;
  const uint32_t* packed = nullptr;  // [E, words_per_expert]
  // Tile order (mma_pack_scales / mma_pack_zero_points); the shape holds the scale block size.
  const uint8_t* scales = nullptr;  // in scale_dtype (f32, f16 or bf16)
  DType scale_dtype = DType::kF32;
  const uint8_t* zero_points = nullptr;  // one byte per entry, or nullptr (symmetric)
  // FP4 (shape.codes): `scales` holds the 8-bit block scales in tile order (NVFP4 e4m3 with
  // fp4_blocks per row, MXFP4 e8m0 with scale_blocks), and global the fp32 scale per expert.
  // FP8: fp8 has no `scales` (global only); fp8_block's block scales per packed row, tile order.
  const float* global = nullptr;
  DType dtype = DType::kBF16;  // activations: bf16 or f16

  // Route p's activation row: x + row * ldx, row = by_token ? permuted_route[p] / slots : p.
  const void* x = nullptr;
  int64_t ldx = 0;
  bool by_token = true;
  int slots = 1;
  const int32_t* permuted_route = nullptr;
  const float* weights = nullptr;  // routing weights by route id (scale_input)

  const int32_t* touched = nullptr;
  const int32_t* n_touched = nullptr;
  const int32_t* offsets = nullptr;
  int max_groups = 0;  // grid: touched indices [0, max_groups)

  bool fc1 = true;  // FC1 epilogue (activation) or FC2 (fp32 store)
  // Launch with programmatic dependent launch (pdl.cuh). FC1 waits for the routing at its start;
  // FC2 first fetches its weights and scales (the routing is complete once FC1 has started), then
  // waits for FC1's activations.
  bool pdl = false;
  ActivationSpec act;
  bool scale_input = false;
  const void* bias = nullptr;  // FC1 bias [E, fc1 rows] in bias_dtype (FC2's bias: finalize)
  DType bias_dtype = DType::kF32;
  void* out = nullptr;  // FC1: [R, ldo] in dtype; FC2: [R, ldo] f32
  int64_t ldo = 0;
  // Optional: a non-finite activation sets bit 4 and the first token (stages.h kErrorInput); the
  // blocks of tile 0 check every activation of their routes.
  int32_t* error = nullptr;

  // The most activation rows one pass stages (0: as many as max_routes, the mma column group (8)
  // and shared memory allow). Fewer rows take less shared memory, so more blocks fit a
  // multiprocessor, and an expert with more routes takes several passes over its weights.
  int max_rows = 0;
  // Where the weight ring lives (decode_launch.h): 0 the launcher chooses, 1 registers, 2 shared
  // memory. Both give the same bits.
  int ring = 0;
  // Register ring: rounds of the ring (kRing chunks each) a warp prefetches into L2 ahead of its
  // loads; 0 none, -1 the launcher's choice (decode_gemv.cu). Either way the same bits.
  int prefetch = -1;
  // Blocks per multiprocessor the launcher keeps room for in shared memory, trading rows per pass
  // (down to half of max_rows) and its own choice of 8 tiles per block (decode_gemv.cu); 0: no
  // such trade. Every choice gives the same bits.
  int min_blocks = 4;

  // FC2 with the combine (fc1 false): a block per route (token t, slot j; another shard's
  // route computes nothing) for the launcher's tiles, as one route per expert would have it,
  // and a cluster of `slots` blocks per token and tiles. Each block hands its tiles' sums to the
  // cluster's first block (distributed shared memory), which adds the token's slots in slot
  // order as the finalize kernel does (stages.h: w_j * (y_j + b2[e_j]), or without w_j for
  // kScaleInput) and stores the output rows: no FC2 rows in memory, no finalize kernel, the same
  // bits as FC2 with the same tiles per block and the finalize kernel. `terms` are the finalize
  // kernel's (stages.h; its out the layer's [tokens, hidden] output; the grid has terms.slots
  // rows of blocks per token), slots at most kCombineMaxSlots (decode_launch.h); out, ldo, bias
  // and scale_input above are FC2's without the combine and unused with it.
  bool combine = false;
  CombineTerms terms;

  // FC1 -> FC2 by counters instead of FC1's whole grid (optional; zeroed by the plan before FC1,
  // stages.h launch_plan): each FC1 block adds 1 to ready[e] of its expert once its rows are
  // stored (a release); an FC2 block (ready_target > 0) fetches its weights and scales, waits
  // until its expert's count reaches ready_target, FC1's blocks per expert (an acquire), reads
  // FC1's rows with coherent loads, and waits for FC1's grid only at its end, so that FC2's end
  // still implies FC1's. FC2's blocks launch once every FC1 block has started (FC1 triggers at
  // its start), so every count they wait on is already being made: no wait is circular.
  int32_t* ready = nullptr;
  int ready_target = 0;
};

// Decode calls of up to this many tokens take FC2 with the combine by default
// (DecodeOptions::combine). On an H100 (graph replays, cold L2, bench/results/
// 2026-12-06-h100-combine.md) against FC2 and the finalize kernel, one token: qwen3-30b-a3b INT4
// 26.7 -> 25.6 us, gpt-oss-20b 45.6 -> 43.9, INT2 on H 2560, E 512, k 10 35.3 -> 34.0,
// qwen3.6-35b-a3b 24.5 -> 23.9, Mixtral-8x7B and DeepSeek-V3 within 0.5%; two tokens qwen3 34.4
// -> 33.3, gpt-oss 69.6 -> 64.6, INT2 level; four tokens qwen3 47.7 -> 48.8 and INT2 53.0 -> 57.1
// (gpt-oss 123.5 -> 121.6).
constexpr int kDecodeCombineTokens = 2;

// The checks the launcher makes before any launch.
Status check_decode_args(const DecodeFcArgs& args);

// Whether an FC of this packed shape fits the kernel's shared memory: one activation row, one
// tile's scales and zero points.
bool decode_fits(const MmaPackShape& shape, bool zero_points);

// Whether FC2 of this packed shape can run with the combine for `slots` route slots: at most
// kCombineMaxSlots, and kCombineMinBlocks blocks of one tile (its row, scales and the cluster's
// gathered sums) in a multiprocessor's shared memory.
bool decode_combine_fits(const MmaPackShape& shape, bool zero_points, int slots);

// The activation rows per pass (DecodeFcArgs::max_rows) for a call of `tokens` on a layer of
// `experts` experts, top_k of them routed and num_shared shared: about four times the mean routes
// per expert, tokens top_k / experts, to the nearest power of two from 2 to 16; 0 (the launcher's
// bound, the token count) with shared experts, which take every token.
int decode_rows_per_pass(int64_t tokens, int top_k, int num_shared, int64_t experts);

// Opts every instantiation into the large shared memory; once per device, before any launch (and
// outside stream capture).
Status prepare_decode_kernels();

// max_routes: an upper bound of any expert's routes in this call (the token count serves: a
// token routes to an expert at most once); it sizes the staged activations (8 routes per pass,
// one mma column group). tiles_per_block: 1, a multiple of 4, or 0 for the launcher's choice (a
// request it cannot honour falls back to fewer).
// blocks_per_expert (optional): the blocks the launch gives each expert (an FC1 launch's count
// is FC2's ready_target).
Status launch_decode_fc(const DecodeFcArgs& args, int max_routes, int tiles_per_block,
                        cudaStream_t stream, int* blocks_per_expert = nullptr);

}  // namespace qmoe::cuda

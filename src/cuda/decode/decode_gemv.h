// Decode kernels for integer weights (int2, int4, int8; symmetric or with zero points; per channel
// or blocks >= 16): one FC of every touched expert, each expert's weights read once per call
// whatever the number of routes that chose it (up to kDecodeMaxRoutes per expert, i.e. calls of
// up to 8 tokens).
//
// A block owns one 16-row tile of one expert and stages its routes' activations in shared memory;
// its 4 warps split K. Each warp streams its part of
// the tile's codes with one 16-byte load per lane per chunk (mma_pack.h), turns them into exact
// (q - zp) bf16/f16 A fragments with a shift, a mask, an OR with a float's exponent bits and one
// subtraction, and multiplies them with the routes' activations (B, 8 routes per mma) on tensor
// cores, accumulating in fp32. Scales are applied per block to the fp32 sums, so the weights are
// never rounded to the activation dtype (summation order differs from the CPU backend: results are
// within tolerance, not bitwise). The 4 warps' partial sums are added in a fixed order.
//   FC1: the epilogue adds the bias, applies the activation (gated units come as (gate, linear)
//        pairs in one thread, see MmaRowMap) and stores the activation in the dtype.
//   FC2: stores fp32 results by route position; finalize sums them per token.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/formats/mma_pack.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe::cuda {

// Routes per expert (one mma column group of 8): calls of up to 8 tokens, since a token routes to
// an expert at most once.
constexpr int kDecodeMaxRoutes = 8;

struct DecodeFcArgs {
  MmaPackShape shape;
  const uint32_t* packed = nullptr;  // [E, words_per_expert]
  const uint8_t* scales = nullptr;   // ORT layout [E, N, blocks] in scale_dtype
  DType scale_dtype = DType::kF32;
  int block_size = 0;                    // 0: per channel
  const uint8_t* zero_points = nullptr;  // ORT stream, or nullptr (symmetric)
  DType dtype = DType::kBF16;            // activations: bf16 or f16

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
};

// Calls of 9..64 tokens: decode_tiled.cu's kernel (activations staged a K slice at a time).
constexpr int kDecodeTiledMaxRoutes = 64;

// The checks both launchers make before any launch.
Status check_decode_args(const DecodeFcArgs& args);

// max_routes: an upper bound of any expert's routes in this call (the token count serves: a
// token routes to an expert at most once); it picks the kernel variant.
Status launch_decode_fc(const DecodeFcArgs& args, int max_routes, cudaStream_t stream);
Status launch_decode_fc_tiled(const DecodeFcArgs& args, int max_routes, cudaStream_t stream);

}  // namespace qmoe::cuda

// Deterministic synthetic layers and inputs. Every (FC, expert) draws from its own generator seeded
// from (seed, fc, expert), so the weights do not depend on the thread count; experts are generated
// and quantized one at a time per worker, so no fp32 copy of a whole FC is ever held.
#pragma once

#include <cstdint>
#include <vector>

#include "qmoe/layer.h"
#include "qmoe/quantize.h"
#include "qmoe/status.h"

namespace qmoe::cli {

struct SyntheticLayer {
  LayerSpec spec;
  QuantizedFc fc1, fc2, fc3;
  std::vector<uint8_t> bias1, bias2, bias3;  // spec.act_dtype, [E, N]
  std::vector<float> router_bias;            // kGroupedTopK: [E - num_shared]

  LayerWeights weights() const;  // views into the buffers above
};

// Weights ~ N(0, 1/K) (approximately Gaussian), quantized with quantize_expert; biases ~ N(0, 0.1);
// the correction bias ~ N(0, 0.1). threads = 0: hardware concurrency.
Status make_synthetic_layer(const LayerSpec& spec, uint64_t seed, int threads, SyntheticLayer* out);

struct SyntheticInputs {
  std::vector<uint8_t> x, logits;  // spec.act_dtype
  RunInputs inputs;
};

// Input ~ N(0, 1) [T, H] and router logits ~ N(0, 4) [T, E].
void make_synthetic_inputs(const LayerSpec& spec, int64_t tokens, uint64_t seed,
                           SyntheticInputs* out);

}  // namespace qmoe::cli

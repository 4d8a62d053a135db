// qmoe: ONNX Runtime com.microsoft::QMoE import. Builds a LayerSpec and LayerWeights 1:1 from the
// operator's attributes and its 21 inputs in ORT's raw layouts.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>

#include "qmoe/layer.h"
#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe {

// The operator's attributes with ORT's defaults. Bit-width overrides of -1 inherit
// expert_weight_bits; block_size <= 0 means one scale per output channel.
struct OrtQMoEAttributes {
  int64_t k = 1;
  std::string activation_type = "relu";
  int64_t normalize_routing_weights = 0;
  int64_t use_sparse_mixer = 0;
  int64_t swiglu_fusion = 0;
  float swiglu_limit = std::numeric_limits<float>::infinity();
  int64_t swiglu_limit_after_activation = 0;
  float activation_alpha = 1.0f;
  float activation_beta = 0.0f;
  int64_t expert_weight_bits = 4;
  int64_t fc1_expert_weight_bits = -1;
  int64_t fc2_expert_weight_bits = -1;
  int64_t fc3_expert_weight_bits = -1;
  int64_t block_size = 0;
  std::string quant_type = "int";
  int64_t weights_prepacked = -1;
  int64_t accuracy_level = 0;
  int64_t num_shared_experts = 0;
};

// ORT's input order.
enum OrtInput : int {
  kOrtInput = 0,
  kOrtRouterProbs,
  kOrtFc1Weights,
  kOrtFc1Scales,
  kOrtFc1Bias,
  kOrtFc2Weights,
  kOrtFc2Scales,
  kOrtFc2Bias,
  kOrtFc3Weights,
  kOrtFc3Scales,
  kOrtFc3Bias,
  kOrtFc1ZeroPoints,
  kOrtFc2ZeroPoints,
  kOrtFc3ZeroPoints,
  kOrtRouterWeights,
  kOrtFc1GlobalScale,
  kOrtFc2GlobalScale,
  kOrtFc1ActScale,
  kOrtFc2ActScale,
  kOrtFc1ActBlockScale,
  kOrtFc2ActBlockScale,
  kNumOrtInputs,
};
// "input", "router_probs", "fc1_experts_weights", ..., "fc2_act_block_scale".
const char* ort_input_name(int index);

// ORT's CPU and CUDA kernels route differently; CUDA is the contract, CPU is selectable.
enum class OrtSemantics : uint8_t {
  kCuda,  // softmax over all experts, top-k (ties to the lower index), optional renormalization
  kCpu,   // top-k of logits then softmax over the k (always normalized), ties to the higher index
};

struct OrtImportOptions {
  OrtSemantics semantics = OrtSemantics::kCuda;
  // Expert parallelism: when router_probs has E columns and fc1_experts_weights holds L < E
  // experts, the weights are experts [first_expert, first_expert + L) (ORT's sharded MoE calls it
  // local_experts_start_index; the QMoE operator has no attribute for it). Must be 0 otherwise.
  int64_t first_expert = 0;
};

// Builds spec and weights from the attributes and inputs (absent inputs have data == nullptr).
// Input 0 and 1 give T, H and E (E > fc1's experts: LayerSpec::local_experts); inter size comes
// from fc2 as ORT computes it. Weights are borrowed: the views point into inputs' memory. Every
// mismatch names the input and the expected shape. weights_prepacked = 1 (an execution provider's
// private layout) is rejected for integer formats; -1 and 0 read the raw layout, as ORT's CPU
// provider does.
Status layer_from_ort(const OrtQMoEAttributes& attrs, const TensorView* inputs,
                      const OrtImportOptions& options, LayerSpec* spec, LayerWeights* weights);

// Attributes as strings (safetensors __metadata__), and back. Unknown keys are an error unless
// they start with "qmoe.".
std::map<std::string, std::string> ort_attributes_to_map(const OrtQMoEAttributes& attrs);
Status ort_attributes_from_map(const std::map<std::string, std::string>& map,
                               OrtQMoEAttributes* attrs);

}  // namespace qmoe

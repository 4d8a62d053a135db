// qmoe: the description of one MoE layer (LayerSpec), the weights it runs on (LayerWeights) and the
// per-call inputs (RunInputs). A LayerSpec can be built 1:1 from ORT QMoE attributes (qmoe/ort.h)
// and validated once against its weights with check_layer().
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "qmoe/format.h"
#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe {

enum class Activation : uint8_t {
  kIdentity,
  kRelu,
  kGelu,  // tanh form: 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3)))
  kSilu,
  kSwiGlu,  // G * sigmoid(alpha G) * (L + beta), G = min(gate, limit), L = clamp(lin, -limit,
            // limit)
  kGeGlu,   // GELU(gate) * lin (ORT CUDA extension); alpha, beta, limit unused
};

// Where the gate and linear halves of a gated activation live.
enum class GluLayout : uint8_t {
  kSeparateFc3 = 0,   // gate = FC1, linear = FC3 (ORT swiglu_fusion = 0)
  kInterleaved = 1,   // FC1 rows [g0, l0, g1, l1, ...] (swiglu_fusion = 1)
  kConcatenated = 2,  // FC1 rows [g0..gI-1, l0..lI-1] (swiglu_fusion = 2)
};

struct ActivationSpec {
  Activation kind = Activation::kSwiGlu;
  GluLayout glu = GluLayout::kInterleaved;
  float alpha = 1.0f;
  float beta = 0.0f;
  float limit = std::numeric_limits<float>::infinity();
  bool limit_after_activation =
      false;  // ORT swiglu_limit_after_activation: clamp G*sigmoid(aG) instead

  bool gated() const { return kind == Activation::kSwiGlu || kind == Activation::kGeGlu; }
};

enum class RoutingMethod : uint8_t {
  kSoftmaxTopK,  // ORT CUDA: softmax over all experts (fp32), top-k, optional renormalization
  kTopKSoftmax,  // Mixtral / Qwen / ORT CPU: top-k of logits, softmax over the k selected
  kSparseMixer,  // PhiMoE sparse mixer, k = 2
  kGroupedTopK,  // DeepSeek-V3: sigmoid, + correction bias, top groups, top-k, scaling factor
  kTopKSigmoid,  // Llama-4: top-k of logits, weight sigmoid(logit)
};

enum class TieBreak : uint8_t { kLowerIndex, kHigherIndex };

// How a shared expert's output is weighted.
enum class SharedWeight : uint8_t {
  kSigmoid,  // sigmoid(its router logit): ORT's rule, Qwen2-MoE's shared_expert_gate
  kOne,      // exactly 1, its router column unread: DeepSeek-V3, Llama-4
};

// How routing weights are applied.
enum class CombineMode : uint8_t {
  kScaleOutput,  // y = sum_j w_j * Expert_j(x)             (every model but Llama-4)
  kScaleInput,   // y = sum_j Expert_j(w_j * x)             (Llama-4)
};

struct RoutingSpec {
  RoutingMethod method = RoutingMethod::kSoftmaxTopK;
  int top_k = 1;
  bool normalize = false;  // renormalize the k weights to sum 1 (skipped when the sum <= 1e-6)
  TieBreak ties = TieBreak::kLowerIndex;
  // Shared experts: the last num_shared experts (and router columns) are always on, each with
  // the weight shared_weight says, outside the normalization; top-k runs over the first
  // E - num_shared columns.
  int num_shared = 0;
  SharedWeight shared_weight = SharedWeight::kSigmoid;
  float sparse_mixer_eps = 0.01f;      // kSparseMixer jitter epsilon
  int n_group = 1;                     // kGroupedTopK
  int topk_group = 1;                  // kGroupedTopK
  float routed_scaling_factor = 1.0f;  // kGroupedTopK (applied after normalization)
  CombineMode combine = CombineMode::kScaleOutput;
};

const char* activation_name(Activation a);
bool parse_activation(const std::string& s, Activation* out);
const char* routing_method_name(RoutingMethod m);
bool parse_routing_method(const std::string& s, RoutingMethod* out);
const char* shared_weight_name(SharedWeight w);  // "sigmoid" or "one"
bool parse_shared_weight(const std::string& s, SharedWeight* out);

struct LayerSpec {
  int64_t hidden = 0;       // H
  int64_t inter = 0;        // I
  int64_t num_experts = 0;  // E: router columns (shared experts included)
  // Local experts (expert parallelism): the weights hold experts [first_expert, first_expert + L)
  // of the E, with L = local_experts (0: all E, and then first_expert must be 0). Routing still
  // runs over all E logits; routes to experts outside the range contribute nothing, so the output
  // is this shard's partial sum, and the shards' outputs add up to the whole layer. Shared experts
  // are experts like the others: the shard whose range holds their index runs them.
  //   router columns  0 .. first-1 | first .. first+L-1 | first+L .. E-1
  //   weights [L, ...]              |  0 .. L-1          |
  int64_t first_expert = 0;
  int64_t local_experts = 0;
  ActivationSpec activation;
  RoutingSpec routing;
  FcFormat fc1;  // logical [F*I, H], F = 2 for fused gated activations
  FcFormat fc2;  // logical [H, I]
  FcFormat fc3;  // logical [I, H]; only with GluLayout::kSeparateFc3
  bool has_fc1_bias = false;
  bool has_fc2_bias = false;
  bool has_fc3_bias = false;
  DType act_dtype = DType::kF32;  // input, router logits and output: f32, f16 or bf16

  bool has_fc3() const { return activation.gated() && activation.glu == GluLayout::kSeparateFc3; }
  int64_t fc1_rows() const {  // N of FC1
    return (activation.gated() && !has_fc3()) ? 2 * inter : inter;
  }
  // Experts in the weight tensors (their leading dimension).
  int64_t weight_experts() const { return local_experts > 0 ? local_experts : num_experts; }
  // Whether the weights hold fewer experts than the router has columns.
  bool sharded() const { return weight_experts() != num_experts; }
  // Whether router expert e (0 <= e < E) is held here.
  bool holds_expert(int64_t e) const {
    return e >= first_expert && e < first_expert + weight_experts();
  }
  // Routes per token: top-k routed plus the shared experts.
  int slots() const { return routing.top_k + routing.num_shared; }
};

// One FC's tensors, in ORT's raw layouts (see FcTensorShapes). Absent tensors have data == nullptr.
struct FcWeights {
  TensorView weight;
  TensorView scales;
  TensorView bias;          // [E, N], act dtype
  TensorView zero_points;   // u8, integer formats only
  TensorView global_scale;  // f32 [E]
};

struct LayerWeights {
  FcWeights fc1, fc2, fc3;
  TensorView router_bias;  // f32 [E - num_shared]: kGroupedTopK e_score_correction_bias
};

// T may be 0 (a call of zero tokens; see PreparedLayer::run). Empty tensors may have null data.
struct RunInputs {
  TensorView input;           // [T, H] (or [B, S, H]), act dtype
  TensorView router_logits;   // [T, E], act dtype (or f32)
  TensorView router_weights;  // optional [T, E]: mixing weights gathered at the selected experts
};

// Validates the spec alone (shapes, attributes, formats).
Status check_spec(const LayerSpec& spec);
// Validates the spec and that every weight tensor has the shape and dtype the spec implies.
Status check_layer(const LayerSpec& spec, const LayerWeights& w);
// Validates one call's inputs; *tokens receives T (0 allowed).
Status check_inputs(const LayerSpec& spec, const RunInputs& in, int64_t* tokens);
// Validates one call's inputs and output; *tokens receives T (0 allowed; then the output may
// have a null pointer).
Status check_run(const LayerSpec& spec, const RunInputs& in, const MutableTensorView& out,
                 int64_t* tokens);

// FLOPs of one call: T * slots * (2 H F I + 2 I H) (+ FC3).
double layer_flops(const LayerSpec& spec, int64_t tokens);
// Bytes of one expert's weights (all FCs, scales, zero points, biases).
int64_t expert_bytes(const LayerSpec& spec);

}  // namespace qmoe

// qmoe: checkpoint import. Reads a Hugging Face MoE checkpoint directory (config.json, safetensors
// shards through model.safetensors.index.json) and writes a model pack: one safetensors file with
// every MoE layer's QMoE tensors and attributes under `layers.N.` (docs/model-pack.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qmoe/format.h"
#include "qmoe/io.h"
#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe {

// What the checkpoint's expert weights hold: plain floats (quantized here) or integer codes of a
// quantizer (transcoded exactly where qmoe's integer formats can express them).
enum class SourceFormat : uint8_t {
  kBf16,
  kFp16,
  kFp32,
  kGptq,
  kAwq,
  kCompressedTensors,
  kFp8,    // quant_method "fp8" with weight_block_size (DeepSeek-V3, Qwen3 FP8): fp8_block
  kMxfp4,  // quant_method "mxfp4" (gpt-oss): *_blocks and *_scales, mxfp4
  kNvfp4,  // quant_method "modelopt", quant_algo NVFP4: weight, weight_scale(_2), nvfp4
};
bool parse_source_format(const std::string& name, SourceFormat* out);
const char* source_format_name(SourceFormat f);

enum class MoeArch : uint8_t {
  kQwen3Moe,    // model_type qwen3_moe: mlp.gate, mlp.experts.N.{gate,up,down}_proj
  kMixtral,     // model_type mixtral: block_sparse_moe.gate, block_sparse_moe.experts.N.{w1,w3,w2}
  kDeepseekV3,  // model_type deepseek_v3: mlp.gate (+ e_score_correction_bias), mlp.experts.N,
                // mlp.shared_experts
  kGptOss,      // model_type gpt_oss: mlp.router (+ bias), mlp.experts.{gate_up,down}_proj*
  kPhiMoe,      // model_type phimoe (Phi-3.5-MoE): Mixtral's names, the sparse mixer
  kQwen2Moe,    // model_type qwen2_moe: Qwen3's names, mlp.shared_expert(_gate)
  kLlama4,      // model_type llama4 (text_config) or llama4_text: feed_forward.router,
                // feed_forward.experts.{gate_up,down}_proj, feed_forward.shared_expert
};

// config.json's quantization_config for quant_method "gptq".
struct GptqConfig {
  bool present = false;
  int bits = 4;        // 4 or 8
  int group_size = 0;  // 0: one group per output channel (GPTQ's -1)
  bool sym = true;     // zero point 2^(bits-1) everywhere
  bool desc_act = false;
  bool v2 = false;  // checkpoint_format gptq_v2: zeros stored as is; v1 stores zero - 1
};

// config.json's quantization_config for quant_method "awq" (AutoAWQ, version "gemm").
struct AwqConfig {
  bool present = false;
  int bits = 4;        // 4 only
  int group_size = 0;  // 0: one group per output channel (AWQ's -1)
};

// config.json's quantization_config for quant_method "compressed-tensors": format
// "pack-quantized" (integer weights) or "float-quantized" (FP8 e4m3 weights), one scheme for every
// quantized Linear.
struct CompressedTensorsConfig {
  bool present = false;
  int bits = 4;        // 4 or 8 (FP8: 8)
  int group_size = 0;  // integers: the group, 0 for strategy "channel"; FP8: the square block of
                       // strategy "block", 0 for "channel" and "tensor"
  bool sym = true;     // false: weight_zero_point present
  bool fp8 = false;    // float-quantized
  bool fp8_tensor = false;  // FP8 strategy "tensor" (one scale per projection)
};

// config.json's quantization_config for quant_method "fp8": e4m3 weights with one fp32 scale per
// weight_block_size block ("weight_scale_inv", multiplied in), activations quantized dynamically.
struct Fp8Config {
  bool present = false;
  int block = 128;  // weight_block_size [block, block]
};

// The MoE part of config.json.
struct MoeModelConfig {
  MoeArch arch = MoeArch::kQwen3Moe;
  std::string model_type;
  int64_t hidden = 0;       // hidden_size
  int64_t inter = 0;        // expert intermediate size (moe_intermediate_size / intermediate_size)
  int64_t num_experts = 0;  // num_experts / num_local_experts
  int top_k = 0;            // num_experts_per_tok
  bool normalize = false;   // Qwen3: norm_topk_prob
  int64_t num_layers = 0;   // num_hidden_layers
  std::vector<int> moe_layers;  // indices of the decoder layers with a sparse MoE block
  // DeepSeek-V3: grouped top-k over sigmoid scores with e_score_correction_bias.
  int n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  int64_t n_shared = 0;  // n_shared_experts: always-on experts of inter * n_shared rows
  // The always-on MLP a layer adds to the routed experts: its intermediate rows (Qwen2-MoE's
  // shared_expert_intermediate_size, DeepSeek-V3's n_shared * inter, Llama-4's inter; 0: none), a
  // multiple of `inter`. The pack holds it as shared_inter / inter experts of `inter` rows each,
  // appended after the routed ones.
  int64_t shared_inter = 0;
  int64_t num_shared() const { return inter > 0 ? shared_inter / inter : 0; }
  float swiglu_limit = 7.0f;    // gpt-oss: the clamp of its SwiGLU
  float router_jitter = 0.01f;  // Phi-3.5-MoE: router_jitter_noise, the sparse mixer's eps
  GptqConfig gptq;
  AwqConfig awq;
  CompressedTensorsConfig ct;
  Fp8Config fp8;
  bool mxfp4 = false;  // quant_method "mxfp4" (no parameters)
  bool nvfp4 = false;  // quant_method "modelopt" with quant_algo "NVFP4", group_size 16
  // The quant_method of quantization_config ("" when absent): which --from it needs.
  std::string quant_method;
};

// Parses config.json's text; `where` names the file in messages.
Status parse_model_config(const std::string& json_text, const std::string& where,
                          MoeModelConfig* out);

// The LayerSpec of one MoE layer of `config` with the given FC formats: SwiGLU (silu(gate) * up)
// with FC1 rows interleaved [gate0, up0, gate1, up1, ...], routing as the architecture does it.
LayerSpec moe_layer_spec(const MoeModelConfig& config, const FcFormat& fc1, const FcFormat& fc2);

struct ConvertOptions {
  std::string src;  // checkpoint directory
  std::string out;  // pack path
  SourceFormat from = SourceFormat::kBf16;
  FcFormat fc1, fc2;      // target formats for float sources (quantized sources decide their own)
  int threads = 0;        // 0: hardware concurrency
  bool progress = false;  // print progress lines to stderr
};

struct ConvertReport {
  int layers = 0;
  int64_t source_bytes = 0;  // checkpoint bytes read (experts and routers)
  int64_t pack_bytes = 0;
  double seconds = 0;
  FcFormat fc1, fc2;
  // GPTQ: (layer, fc, expert) groups that no qmoe format holds exactly were requantized from the
  // GPTQ dequantization; the worst relative-norm error of those experts.
  int64_t experts_requantized = 0;
  double max_requant_error = 0;
  // GPTQ act-order (desc_act): experts whose intermediate index was reordered so that
  // down_proj's groups are contiguous (exact), and requantized experts whose g_idx has no
  // contiguous equivalent (gate/up's over the hidden size; counted in experts_requantized too).
  int64_t experts_reordered = 0;
  int64_t experts_act_order_requantized = 0;
  std::vector<std::string> notes;  // the first requantized experts by name, then a summary
};

// Converts a checkpoint directory into a pack. Everything is validated (config, index, every
// tensor's presence, dtype and shape) before the first weight is converted; the pack is written to
// a temporary file renamed into place only on success.
Status convert_checkpoint(const ConvertOptions& options, ConvertReport* report);

// ---- model packs ----

constexpr const char* kPackFormatVersion = "1";

// One layer of a pack: spec and weights point into the pack's mapping.
struct PackLayer {
  int index = 0;  // the decoder layer index N
  LayerSpec spec;
  LayerWeights weights;
  TensorView router_weight;  // f32 [E, H]
  TensorView router_bias;    // f32 [E], added to the logits (gpt-oss); absent elsewhere
};

class ModelPack {
 public:
  static Status open(const std::string& path, std::unique_ptr<ModelPack>* out);

  const SafetensorsFile& file() const { return *file_; }
  const std::vector<int>& layer_indices() const { return layers_; }
  // Pack-level metadata (keys without a `layers.` prefix).
  const std::map<std::string, std::string>& info() const { return info_; }
  // Builds and validates layer N (check_layer); an error names the pack and the layer.
  Status layer(int index, PackLayer* out) const;

 private:
  std::unique_ptr<SafetensorsFile> file_;
  std::vector<int> layers_;
  std::map<std::string, std::string> info_;
};

// Router logits [T, E] = x [T, H] * router_weight^T (+ router_bias [E] when present), accumulated
// in fp64, rounded to f32 and then to `out_dtype` (f32, f16 or bf16). x may be f32, f16 or bf16.
Status router_logits(const TensorView& x, const TensorView& router_weight,
                     const TensorView& router_bias, DType out_dtype, std::vector<uint8_t>* out,
                     TensorView* view);

}  // namespace qmoe

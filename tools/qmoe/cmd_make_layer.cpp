// `qmoe make-layer`: writes a preset layer on synthetic weights as a layer file (ORT QMoE tensors
// and attributes, docs/layer-file.md) and, optionally, an input file for it.
#include <cstdio>
#include <memory>

#include "cli.h"
#include "describe.h"
#include "format_flags.h"
#include "presets.h"
#include "qmoe/io.h"
#include "record.h"
#include "synth.h"

namespace qmoe::cli {

namespace {

struct MakeLayerArgs {
  std::string preset = kDefaultPreset;
  int64_t tokens = 16;
  std::string dtype = "bf16";
  uint64_t seed = 0;
  int threads = 0;
  FormatFlags formats;
  std::string layer_out, input_out;
};

int make_layer(const MakeLayerArgs& a) {
  const Preset* preset = find_preset(a.preset);
  if (!preset) {
    return usage_error("--preset: unknown preset '" + a.preset + "' (known: " + preset_names() +
                       ")");
  }
  LayerSpec spec = preset->spec;
  Status s = parse_act_dtype(a.dtype, "--dtype", &spec.act_dtype);
  if (s.is_ok()) s = apply_format_flags(a.formats, preset->name, &spec);
  if (s.is_ok()) s = check_spec(spec);
  // Fail before the (possibly long) synthesis when the file could not describe the layer.
  std::map<std::string, std::string> metadata;
  if (s.is_ok()) s = layer_file_metadata(spec, &metadata);
  if (s.is_ok()) s = check_output_path("--layer-out", a.layer_out);
  if (s.is_ok() && !a.input_out.empty()) s = check_output_path("--input-out", a.input_out);
  if (!s.is_ok()) return status_error(s);

  SyntheticLayer layer;
  s = make_synthetic_layer(spec, a.seed, a.threads, &layer);
  if (s.is_ok()) s = save_layer_file(a.layer_out, spec, layer.weights());
  if (!s.is_ok()) return status_error(s);
  std::printf("wrote %s: %s (%s), %s, %s; %s\n", a.layer_out.c_str(), preset->name.c_str(),
              describe_shape(spec).c_str(), describe_routing(spec).c_str(),
              describe_activation(spec).c_str(), describe_formats(spec).c_str());
  if (a.input_out.empty()) return kExitOk;

  SyntheticInputs in;
  make_synthetic_inputs(spec, a.tokens, a.seed, &in);
  s = save_input_file(a.input_out, in.inputs);
  if (!s.is_ok()) return status_error(s);
  std::printf("wrote %s: input %s %s, router_probs %s %s\n", a.input_out.c_str(),
              dtype_name(in.inputs.input.dtype), in.inputs.input.shape_string().c_str(),
              dtype_name(in.inputs.router_logits.dtype),
              in.inputs.router_logits.shape_string().c_str());
  return kExitOk;
}

}  // namespace

void add_make_layer_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<MakeLayerArgs>();
  CLI::App* cmd = app.add_subcommand(
      "make-layer", "write a preset layer on synthetic weights as a layer file, and an input file");
  cmd->add_option("--preset,--presets", a->preset, "model shape: " + preset_names())
      ->capture_default_str();
  add_format_flags(cmd, &a->formats);
  cmd->add_option("--tokens", a->tokens, "tokens in the input file")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "activation dtype (input, router logits, biases)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "seed of the synthetic weights and inputs")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "worker threads for quantization (0: one per core)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--layer-out", a->layer_out, "layer file to write")->required();
  cmd->add_option("--input-out", a->input_out, "input file to write");
  cmd->footer(std::string("Examples:\n"
                          "  qmoe make-layer --layer-out L.safetensors --input-out X.safetensors\n"
                          "  qmoe make-layer --preset gpt-oss-20b --tokens 8 --layer-out "
                          "gpt.safetensors\n") +
              kExitCodesHelp);
  cmd->callback([a, exit_code] { *exit_code = make_layer(*a); });
}

}  // namespace qmoe::cli

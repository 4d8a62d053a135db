// `qmoe run`: a preset layer on synthetic weights, or a layer file on an input file; timed and
// checked against the fp64 oracle.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "cli.h"
#include "describe.h"
#include "execute.h"
#include "format_flags.h"
#include "presets.h"
#include "qmoe/convert.h"
#include "qmoe/io.h"
#include "record.h"
#include "synth.h"

namespace qmoe::cli {

namespace {

struct RunArgs {
  std::string preset = kDefaultPreset;
  int64_t tokens = 16;
  std::string dtype = "bf16";
  uint64_t seed = 0;
  FormatFlags formats;
  std::string backend = "auto";
  int threads = 0;
  int repeat = 0;  // 0: 5 on the CPU, 50 on the GPU
  bool no_check = false;
  std::string layer, input, output, model;
  CLI::Option *preset_opt = nullptr, *tokens_opt = nullptr, *dtype_opt = nullptr,
              *seed_opt = nullptr;
};

Status exec_options(const RunArgs& a, ExecOptions* o) {
  QMOE_RETURN_IF_ERROR(parse_backend(a.backend, &o->backend));
  o->threads = a.threads;
  o->repeat = a.repeat > 0 ? a.repeat : (o->backend == BackendKind::kCuda ? 50 : 5);
  o->check = !a.no_check;
  return Status::ok();
}

int finish(const Status& s, bool check_failed) {
  if (!s.is_ok()) return status_error(s);
  return check_failed ? kExitCheckFailed : kExitOk;
}

// Runs, reports and checks a layer given by files; writes --output when asked.
int execute_and_save(const RunArgs& a, const LayerSpec& spec, const LayerWeights& weights,
                     const RunInputs& inputs, const ExecOptions& options) {
  std::vector<uint8_t> output;
  MutableTensorView out;
  bool failed = false;
  Status s = execute_and_report(spec, weights, inputs, options, &output, &out, &failed);
  if (s.is_ok() && !a.output.empty()) {
    s = save_output_file(a.output, out.as_const());
    if (s.is_ok()) std::printf("%-10s %s\n", "output", a.output.c_str());
  }
  return finish(s, failed);
}

int run_file(const RunArgs& a) {
  if (a.layer.empty() || a.input.empty()) {
    return usage_error("run: --layer and --input go together (a layer file and an input file)");
  }
  for (const CLI::Option* o : {a.preset_opt, a.tokens_opt, a.dtype_opt, a.seed_opt}) {
    if (o->count() > 0) {
      return usage_error("run: " + o->get_name() +
                         " cannot be combined with --layer (the files define the layer and "
                         "its input)");
    }
  }
  if (a.formats.any_given()) {
    return usage_error(
        "run: format options cannot be combined with --layer (the layer file "
        "holds quantized weights)");
  }
  ExecOptions options;
  Status s = exec_options(a, &options);
  if (s.is_ok() && !a.output.empty()) s = check_output_path("--output", a.output);
  if (!s.is_ok()) return status_error(s);
  LoadedLayer layer;
  s = load_layer_file(a.layer, &layer);
  if (!s.is_ok()) return status_error(s);
  LoadedInputs in;
  s = load_input_file(a.input, &in);
  if (!s.is_ok()) return status_error(s);
  // The call's input decides the activation dtype.
  LayerSpec spec = layer.spec;
  spec.act_dtype = in.inputs.input.dtype;

  std::printf("%-10s %s: %s\n", "layer", a.layer.c_str(), describe_shape(spec).c_str());
  std::printf("%-10s %s\n", "routing", describe_routing(spec).c_str());
  std::printf("%-10s %s\n", "activation", describe_activation(spec).c_str());
  std::printf("%-10s %s: %s %s\n", "input", a.input.c_str(), dtype_name(in.inputs.input.dtype),
              in.inputs.input.shape_string().c_str());
  return execute_and_save(a, spec, layer.weights, in.inputs, options);
}

// The call's inputs for a pack layer: `input` from --input (router_probs too when the file has
// them), else synthetic; router logits computed from the pack's router weight when not given.
Status model_inputs(const RunArgs& a, const PackLayer& layer, LayerSpec* spec,
                    std::unique_ptr<SafetensorsFile>* file, SyntheticInputs* in) {
  if (a.input.empty()) {
    QMOE_RETURN_IF_ERROR(parse_act_dtype(a.dtype, "--dtype", &spec->act_dtype));
    make_synthetic_inputs(*spec, a.tokens, a.seed, in);
  } else {
    QMOE_RETURN_IF_ERROR(SafetensorsFile::open(a.input, file));
    QMOE_RETURN_IF_ERROR((*file)->get("input", &in->inputs.input));
    spec->act_dtype = in->inputs.input.dtype;
    if (const TensorView* p = (*file)->find("router_probs")) {
      in->inputs.router_logits = *p;
      return Status::ok();
    }
  }
  return router_logits(in->inputs.input, layer.router_weight, layer.router_bias, spec->act_dtype,
                       &in->logits, &in->inputs.router_logits);
}

int run_model(const RunArgs& a) {
  char* end = nullptr;
  const long index = std::strtol(a.layer.c_str(), &end, 10);
  if (a.layer.empty() || *end != '\0' || index < 0) {
    return usage_error(
        "run: --model needs --layer N, the index of an MoE layer of the pack, got '" + a.layer +
        "'");
  }
  if (a.preset_opt->count() > 0 || a.formats.any_given()) {
    return usage_error(
        "run: --preset and format options cannot be combined with --model (the "
        "pack defines the layer)");
  }
  if (!a.input.empty() &&
      (a.tokens_opt->count() > 0 || a.dtype_opt->count() > 0 || a.seed_opt->count() > 0)) {
    return usage_error(
        "run: --tokens, --dtype and --seed describe synthetic inputs; --input "
        "gives them");
  }
  ExecOptions options;
  Status s = exec_options(a, &options);
  if (s.is_ok() && !a.output.empty()) s = check_output_path("--output", a.output);
  std::unique_ptr<ModelPack> pack;
  if (s.is_ok()) s = ModelPack::open(a.model, &pack);
  PackLayer layer;
  if (s.is_ok()) s = pack->layer(static_cast<int>(index), &layer);
  LayerSpec spec = layer.spec;
  std::unique_ptr<SafetensorsFile> file;
  SyntheticInputs in;
  if (s.is_ok()) s = model_inputs(a, layer, &spec, &file, &in);
  if (!s.is_ok()) return status_error(s);

  std::printf("%-10s %s layer %ld: %s; %s\n", "model", a.model.c_str(), index,
              describe_shape(spec).c_str(), describe_formats(spec).c_str());
  std::printf("%-10s %s\n", "routing", describe_routing(spec).c_str());
  std::printf("%-10s %s\n", "activation", describe_activation(spec).c_str());
  std::printf("%-10s %s %s%s; router logits from the pack's router weight\n", "input",
              dtype_name(spec.act_dtype), in.inputs.input.shape_string().c_str(),
              a.input.empty() ? (", seed " + std::to_string(a.seed)).c_str() : "");
  return execute_and_save(a, spec, layer.weights, in.inputs, options);
}

int run_synthetic(const RunArgs& a) {
  const Preset* preset = find_preset(a.preset);
  if (!preset) {
    return usage_error("--preset: unknown preset '" + a.preset + "' (known: " + preset_names() +
                       ")");
  }
  ExecOptions options;
  Status s = exec_options(a, &options);
  if (!s.is_ok()) return status_error(s);
  LayerSpec spec = preset->spec;
  s = parse_act_dtype(a.dtype, "--dtype", &spec.act_dtype);
  if (s.is_ok()) s = apply_format_flags(a.formats, preset->name, &spec);
  if (s.is_ok()) s = check_spec(spec);
  if (!s.is_ok()) return status_error(s);

  std::printf("%-10s %s (%s): %s\n", "preset", preset->name.c_str(), preset->model.c_str(),
              describe_shape(spec).c_str());
  std::printf("%-10s %s\n", "routing", describe_routing(spec).c_str());
  std::printf("%-10s %s\n", "activation", describe_activation(spec).c_str());
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  SyntheticLayer layer;
  s = make_synthetic_layer(spec, a.seed, a.threads, &layer);
  if (!s.is_ok()) return status_error(s);
  const double synth_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  SyntheticInputs in;
  make_synthetic_inputs(spec, a.tokens, a.seed, &in);
  std::printf("%-10s %lld tokens, seed %llu; weights synthesized and quantized in %.2f s\n",
              "input", static_cast<long long>(a.tokens), static_cast<unsigned long long>(a.seed),
              synth_s);
  std::vector<uint8_t> output;
  MutableTensorView out;
  bool failed = false;
  s = execute_and_report(spec, layer.weights(), in.inputs, options, &output, &out, &failed);
  return finish(s, failed);
}

}  // namespace

void add_run_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "run one MoE layer, time it and check it against the fp64 oracle: a preset model shape on "
      "synthetic weights (default: " +
          std::string(kDefaultPreset) +
          ", INT4, 16 bf16 tokens), or --layer L --input X [--output Y]");
  a->preset_opt = cmd->add_option("--preset,--presets", a->preset, "model shape: " + preset_names())
                      ->capture_default_str();
  a->tokens_opt = cmd->add_option("--tokens", a->tokens, "tokens per call")
                      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
                      ->capture_default_str();
  a->dtype_opt = cmd->add_option("--dtype", a->dtype, "activation dtype: f32, f16 or bf16")
                     ->capture_default_str();
  a->seed_opt = cmd->add_option("--seed", a->seed, "seed of the synthetic weights and inputs")
                    ->capture_default_str();
  add_format_flags(cmd, &a->formats);
  cmd->add_option("--backend", a->backend, "auto, cpu or cuda (auto: cuda when available)")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU worker threads (0: one per core)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_option("--repeat", a->repeat,
                  "timed runs after one warm-up run (0: 5 on the CPU, 50 on the GPU)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  cmd->add_flag("--no-check", a->no_check, "skip the comparison with the fp64 oracle");
  cmd->add_option("--layer", a->layer,
                  "layer file (safetensors, docs/layer-file.md); with --model, a layer index");
  cmd->add_option("--model", a->model,
                  "model pack (qmoe convert, docs/model-pack.md): runs its layer --layer N on "
                  "--input X or synthetic inputs");
  cmd->add_option("--input", a->input, "input file: input [T, H], router_probs [T, E]");
  cmd->add_option("--output", a->output, "writes output [T, H] here (with --layer)");
  cmd->footer(std::string("Examples:\n"
                          "  qmoe run\n"
                          "  qmoe run --preset mixtral-8x7b --format int8 --tokens 4\n"
                          "  qmoe run --preset deepseek-v3 --tokens 1 --backend cuda\n"
                          "  qmoe run --layer L.safetensors --input X.safetensors --output "
                          "Y.safetensors\n"
                          "  qmoe run --model P.safetensors --layer 0 --tokens 4\n") +
              kExitCodesHelp);
  cmd->callback([a, exit_code] {
    if (!a->model.empty()) {
      *exit_code = run_model(*a);
    } else if (!a->output.empty() && a->layer.empty()) {
      *exit_code = usage_error("run: --output needs --layer and --input");
    } else if (!a->layer.empty() || !a->input.empty()) {
      *exit_code = run_file(*a);
    } else {
      *exit_code = run_synthetic(*a);
    }
  });
}

}  // namespace qmoe::cli

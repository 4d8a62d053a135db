// `qmoe convert`: a Hugging Face MoE checkpoint directory to a qmoe model pack
// (docs/model-pack.md).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "cli.h"
#include "describe.h"
#include "format_flags.h"
#include "qmoe/convert.h"
#include "record.h"

namespace qmoe::cli {

namespace {

constexpr const char* kSources =
    "bf16, fp16, fp32, gptq, awq, compressed-tensors, fp8, mxfp4 or nvfp4";

struct ConvertArgs {
  std::string from, src, out;
  FormatFlags formats;
  int threads = 0;
};

// The target formats of a float checkpoint: int4 b128 unless the format flags say otherwise,
// checked against the checkpoint's shapes (config.json is read here for that).
Status float_formats(const ConvertArgs& a, LayerSpec* spec) {
  const std::string path = a.src + "/config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::io_error(path + ": cannot open");
  std::ostringstream text;
  text << f.rdbuf();
  MoeModelConfig cfg;
  QMOE_RETURN_IF_ERROR(parse_model_config(text.str(), path, &cfg));
  const FcFormat int4 = default_fc_format(WeightFormat::kInt4);
  *spec = moe_layer_spec(cfg, int4, int4);
  Status s = apply_format_flags(a.formats, "checkpoint", spec);
  if (!s.is_ok()) {
    std::string m = s.message();
    const std::string tag = "preset checkpoint: ";
    if (m.rfind(tag, 0) == 0) m = m.substr(tag.size());
    return Status(s.code(), a.src + ": " + m);
  }
  // A pack layer must be expressible as a layer file (e.g. one block size for both FCs).
  std::map<std::string, std::string> metadata;
  return layer_file_metadata(*spec, &metadata);
}

int convert(const ConvertArgs& a) {
  SourceFormat from;
  if (!parse_source_format(a.from, &from)) {
    return usage_error("--from: expected " + std::string(kSources) + ", got '" + a.from + "'");
  }
  Status s = check_output_path("--output", a.out);
  if (!s.is_ok()) return status_error(s);
  ConvertOptions o;
  o.src = a.src;
  o.out = a.out;
  o.from = from;
  o.threads = a.threads;
  o.progress = ::isatty(2) != 0;
  const bool quantized =
      from != SourceFormat::kBf16 && from != SourceFormat::kFp16 && from != SourceFormat::kFp32;
  if (quantized) {
    if (a.formats.any_given()) {
      return usage_error(std::string("convert: format options apply to float checkpoints; a ") +
                         source_format_name(from) + " checkpoint keeps its own format");
    }
  } else {
    LayerSpec spec;
    s = float_formats(a, &spec);
    if (!s.is_ok()) return status_error(s);
    o.fc1 = spec.fc1;
    o.fc2 = spec.fc2;
  }
  ConvertReport r;
  s = convert_checkpoint(o, &r);
  if (!s.is_ok()) return status_error(s);
  std::printf("wrote %s: %d MoE layers, fc1 %s, fc2 %s, %.3f GB\n", a.out.c_str(), r.layers,
              r.fc1.to_string().c_str(), r.fc2.to_string().c_str(), r.pack_bytes / 1e9);
  std::printf("read %.3f GB of %s checkpoint in %.2f s: %.3f GB/s\n", r.source_bytes / 1e9,
              source_format_name(from), r.seconds,
              r.source_bytes / 1e9 / std::max(r.seconds, 1e-9));
  if (quantized) {
    if (r.experts_requantized == 0) {
      std::printf("exact: every layer dequantizes bit for bit to the %s checkpoint\n",
                  source_format_name(from));
    } else {
      std::printf(
          "requantized %lld expert(s) (see the notes): worst relative-norm error %.3e; the rest "
          "is exact\n",
          static_cast<long long>(r.experts_requantized), r.max_requant_error);
    }
  }
  for (const std::string& n : r.notes) std::printf("note: %s\n", n.c_str());
  return kExitOk;
}

}  // namespace

void add_convert_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "convert a Hugging Face MoE checkpoint (Qwen3-MoE, Mixtral, Phi-3.5-MoE, DeepSeek-V3, "
      "gpt-oss; "
      "bf16/fp16/fp32, GPTQ, AWQ, compressed-tensors, block-scaled FP8, gpt-oss MXFP4 or ModelOpt "
      "NVFP4) into a "
      "model pack (docs/model-pack.md)");
  cmd->add_option("--from", a->from, std::string("what the checkpoint holds: ") + kSources)
      ->required();
  cmd->add_option("SRC", a->src, "checkpoint directory (config.json, *.safetensors)")->required();
  cmd->add_option("-o,--output", a->out, "the pack to write (safetensors)")->required();
  add_format_flags(cmd, &a->formats);
  cmd->add_option("--threads", a->threads, "worker threads (0: one per core)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->footer(std::string("Float checkpoints are quantized to int4 (block 128) unless the format "
                          "options say otherwise; quantized checkpoints keep their own.\n"
                          "Examples:\n"
                          "  qmoe convert --from bf16 Qwen3-30B-A3B -o qwen3.pack.safetensors\n"
                          "  qmoe convert --from bf16 --format int8 --block 64 Mixtral-8x7B -o "
                          "mixtral.safetensors\n"
                          "  qmoe convert --from gptq Qwen3-30B-A3B-GPTQ-Int4 -o q.safetensors\n"
                          "  qmoe convert --from awq Mixtral-8x7B-AWQ -o m.safetensors\n"
                          "  qmoe convert --from fp8 DeepSeek-V3 -o ds.safetensors\n"
                          "  qmoe convert --from mxfp4 gpt-oss-20b -o oss.safetensors\n"
                          "  qmoe info q.safetensors\n"
                          "  qmoe run --model q.safetensors --layer 0 --tokens 4\n") +
              kExitCodesHelp);
  cmd->callback([a, exit_code] { *exit_code = convert(*a); });
}

}  // namespace qmoe::cli

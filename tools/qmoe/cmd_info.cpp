// `qmoe info`: version, weight formats, backends (and the GPU), presets. The formats table comes
// from QMOE_WEIGHT_FORMATS through format_info(); --formats-markdown prints the table README.md
// carries.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_info.h"
#include "describe.h"
#include "presets.h"
#include "qmoe/convert.h"
#include "qmoe/format.h"
#include "qmoe/quantize.h"

#ifndef QMOE_VERSION
#define QMOE_VERSION "unknown"
#endif

namespace qmoe::cli {

namespace {

using Row = std::vector<std::string>;

std::string blocks(const FormatInfo& f) {
  const std::string b = std::to_string(f.default_block);
  switch (f.block_rule) {
    case BlockRule::kIntBlocks:
      return "per channel, or 16..256 along K (default " + b + ")";
    case BlockRule::kFixed:
      return b + " along K";
    case BlockRule::kNone:
      return "none";
    case BlockRule::kSquare:
      return b + "x" + b + " over (N, K)";
  }
  return "?";
}

std::string scales(const FormatInfo& f) {
  switch (f.kind) {
    case FormatKind::kInteger:
      return "f32, f16 or bf16";
    case FormatKind::kFp4:
      return std::string(dtype_name(default_fc_format(f.id).scale_dtype)) + " + f32 global";
    case FormatKind::kFp8:
      return f.block_rule == BlockRule::kSquare ? "f32, f16 or bf16" : "f32 global per expert";
  }
  return "?";
}

std::string budget(const FormatInfo& f) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", quantization_error_budget(default_fc_format(f.id)));
  return buf;
}

std::vector<Row> format_rows() {
  std::vector<Row> rows = {{"format", "ORT quant_type", "bits", "blocks", "zero points", "scales",
                            "error budget", "layout"}};
  for (int i = 0; i < kNumWeightFormats; ++i) {
    const FormatInfo& f = format_info(static_cast<WeightFormat>(i));
    rows.push_back({f.name, f.ort_quant_type, std::to_string(f.code_bits), blocks(f),
                    f.zero_points_allowed ? "optional" : "no", scales(f), budget(f), f.summary});
  }
  return rows;
}

std::string markdown(const std::vector<Row>& rows) {
  std::string s;
  for (size_t r = 0; r < rows.size(); ++r) {
    s += "|";
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const bool code = r > 0 && c < 2;  // format and quant_type names are identifiers
      s += " " + (code ? "`" + rows[r][c] + "`" : rows[r][c]) + " |";
    }
    s += "\n";
    if (r == 0) {
      s += "|";
      for (size_t c = 0; c < rows[r].size(); ++c) s += "---|";
      s += "\n";
    }
  }
  return s;
}

// Columns padded to their widest cell, indented by two spaces.
std::string aligned(const std::vector<Row>& rows) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const Row& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::string s;
  for (const Row& r : rows) {
    std::string line = " ";
    for (size_t c = 0; c < r.size(); ++c) {
      line += " " + r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size(), ' ');
    }
    s += line + "\n";
  }
  return s;
}

std::string cuda_line() {
#ifdef QMOE_WITH_CUDA
  CudaDeviceInfo info;
  if (!cuda_device_info(&info)) return "built with CUDA; no device";
  char buf[256];
  std::snprintf(buf, sizeof(buf), "built with CUDA; device 0 of %d: %s (sm_%d%d, %d SMs, %.1f GiB)",
                info.device_count, info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count,
                static_cast<double>(info.global_mem_bytes) / (1ull << 30));
  std::string s = buf;
  std::string why;
  s += cuda_backend_available(&why) ? "; backend available" : "; backend unavailable: " + why;
  return s;
#else
  return "not built (configure with -DQMOE_CUDA=ON on a machine with the CUDA toolkit)";
#endif
}

int info(bool formats_markdown) {
  if (formats_markdown) {
    std::fputs(markdown(format_rows()).c_str(), stdout);
    return kExitOk;
  }
  std::printf("qmoe %s\n\nweight formats\n%s\n", QMOE_VERSION, aligned(format_rows()).c_str());
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf("backends\n  cpu   available, %u threads by default\n  cuda  %s\n\n", cores,
              cuda_line().c_str());
  std::vector<Row> rows;
  for (const Preset& p : presets()) {
    std::string d = p.model + ": " + describe_shape(p.spec) + "; " + describe_routing(p.spec) +
                    "; " + describe_activation(p.spec) + "; " + describe_formats(p.spec);
    if (!p.note.empty()) d += "; " + p.note;
    rows.push_back({p.name, d});
  }
  std::printf("presets\n%s", aligned(rows).c_str());
  return kExitOk;
}

// `qmoe info PACK`: what a model pack holds, layer by layer.
int pack_info(const std::string& path) {
  std::unique_ptr<ModelPack> pack;
  Status s = ModelPack::open(path, &pack);
  if (!s.is_ok()) return status_error(s);
  const SafetensorsFile& f = pack->file();
  std::printf("pack %s\n", path.c_str());
  for (const auto& kv : pack->info())
    std::printf("  %-22s %s\n", kv.first.c_str(), kv.second.c_str());
  std::printf("  %-22s %zu\n\n", "MoE layers", pack->layer_indices().size());
  std::vector<Row> rows = {{"layer", "shape", "formats", "routing", "activation", "bytes"}};
  double total = 0;
  for (int index : pack->layer_indices()) {
    PackLayer l;
    s = pack->layer(index, &l);
    if (!s.is_ok()) return status_error(s);
    const std::string prefix = "layers." + std::to_string(index) + ".";
    double bytes = 0;
    for (const std::string& name : f.names()) {
      if (name.rfind(prefix, 0) == 0) bytes += static_cast<double>(f.find(name)->bytes());
    }
    total += bytes;
    char mb[32];
    std::snprintf(mb, sizeof(mb), "%.1f MB", bytes / 1e6);
    rows.push_back({std::to_string(index), describe_shape(l.spec), describe_formats(l.spec),
                    describe_routing(l.spec), describe_activation(l.spec), mb});
  }
  std::printf("%s\ntotal %.1f MB of tensors\n", aligned(rows).c_str(), total / 1e6);
  return kExitOk;
}

}  // namespace

void add_info_command(CLI::App& app, int* exit_code) {
  auto formats_markdown = std::make_shared<bool>(false);
  auto pack = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "info", "version, weight formats, backends, presets; or, given a model pack, its layers");
  cmd->add_flag("--formats-markdown", *formats_markdown,
                "print only the weight-format table, as markdown (the table in README.md)");
  cmd->add_option("PACK", *pack, "a model pack (qmoe convert) to describe");
  cmd->callback([formats_markdown, pack, exit_code] {
    *exit_code = pack->empty() ? info(*formats_markdown) : pack_info(*pack);
  });
}

}  // namespace qmoe::cli

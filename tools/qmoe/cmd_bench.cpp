// `qmoe bench`: decode and prefill timing of preset layers over a list of token counts. Per case:
// the experts the routing touches and their bytes, the time per call (median, p10, p90), the
// achieved GB/s of weights against the device's read ceiling, TFLOP/s, and the error against the
// fp64 oracle. A table on stdout and one CSV row per case.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "cli.h"
#include "core/tensor_check.h"
#include "describe.h"
#include "execute.h"
#include "format_flags.h"
#include "host_buffer.h"
#include "presets.h"
#include "qmoe/routing.h"
#include "qmoe/tuning.h"
#include "record.h"
#include "synth.h"

#include <nlohmann/json.hpp>

namespace qmoe::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct BenchArgs {
  std::vector<std::string> presets = {kDefaultPreset};
  std::vector<int64_t> shape;  // --shape H,I,E,K: the presets' routing and activation at this size
  std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 32, 64};
  std::string dtype = "bf16";
  FormatFlags formats;
  std::string backend = "auto";
  int threads = 0;
  int repeat = 0;   // 0: 100 on the GPU, 5 on the CPU
  int warmup = -1;  // -1: 10 on the GPU, 1 on the CPU
  std::string csv;   // --csv FILE: append rows there (nothing is written unless asked)
  std::string json;  // --json FILE: the rows and the run's record as one JSON document
  bool cold_l2 = false, warm_l2 = false;
  std::string l2_flush = "read";
  uint64_t seed = 0;
  bool no_graph = false, no_check = false;
  std::string tune;  // --tune FILE: time every dispatch choice first, store the fastest
};

// ---------------------------------------------------------------------------------------------
// CSV
// ---------------------------------------------------------------------------------------------

// The header; csv_row() writes the fields in this order.
constexpr const char* kHeader =
    "preset,format,dtype,tokens,experts_touched,bytes_touched,us_median,us_p10,us_p90,gbps,"
    "pct_of_read_ceiling,tflops,read_ceiling_gbps,error,budget,check,backend,device,graph,l2,"
    "warmup,repeat,seed,read_ceiling_method,hidden,inter,experts,top_k,shared,path,commit,"
    "driver,cuda_runtime,settings,time_utc";

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + csv_field(fields[i]);
  return line;
}

// Opens `path` for appending. A new or empty file gets the header; a file whose first line is a
// different header is refused, so that one file never mixes two layouts.
Status open_csv(const std::string& path, std::ofstream* f) {
  std::string first;
  {
    std::ifstream in(path);
    if (in) std::getline(in, first);
  }
  const std::string header = kHeader;
  if (!first.empty() && first != header) {
    return Status::invalid("--csv: " + path +
                           " exists with other columns; expected its first line to be '" + header +
                           "' (choose another file)");
  }
  f->open(path, std::ios::app);
  if (!*f) return Status::io_error("--csv: cannot open " + path + " for appending");
  if (first.empty()) *f << header << '\n';
  f->flush();
  return Status::ok();
}

std::string num(double v, const char* fmt = "%.4g") {
  char b[64];
  std::snprintf(b, sizeof(b), fmt, v);
  return b;
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

// What every case of one invocation shares.
struct BenchContext {
  BackendKind backend = BackendKind::kCpu;
  BenchTiming timing;
  bool check = true;
  uint64_t seed = 0;
  std::string device;
  ReadCeiling ceiling;  // gbps 0: none (the CPU backend)
  RunRecord record;     // the build, the machine and the settings every row names
  PrepareOptions options;  // resolved once (the environment's settings); every layer's
};

// The CSV's l2 column: warm, or cold with the flush that made it (BenchTiming::Flush).
std::string l2_label(const BenchContext& ctx) {
  if (ctx.backend != BackendKind::kCuda || !ctx.timing.cold_l2) return "warm";
  switch (ctx.timing.flush) {
    case BenchTiming::Flush::kRead:
      return "cold-read";
    case BenchTiming::Flush::kWrite:
      return "cold-write";
    case BenchTiming::Flush::kRotate:
      break;
  }
  return "cold-rotate";
}

struct CaseResult {
  std::string path;  // the backend's dispatch choice ("" where it has one path)
  int64_t tokens = 0, touched = 0;
  double bytes = 0, us_median = 0, us_p10 = 0, us_p90 = 0, gbps = 0, tflops = 0;
  bool checked = false, failed = false;
  double error = 0, budget = 0;
};

// layers: the layer and, for --l2-flush rotate, its copies (the CPU backend uses the first).
using Layers = std::vector<PreparedLayer*>;

Status time_case(const BenchContext& ctx, const Layers& layers, const RunInputs& in,
                 const MutableTensorView& out, std::vector<double>* us) {
#ifdef QMOE_WITH_CUDA
  if (ctx.backend == BackendKind::kCuda) return time_cuda_case(layers, in, out, ctx.timing, us);
#endif
  if (ctx.backend != BackendKind::kCpu) {
    return Status::unsupported("--backend: this build has no CUDA backend");
  }
  return time_cpu_case(*layers[0], in, out, ctx.timing, us);
}

Status run_case(const BenchContext& ctx, const Layers& layers, const SyntheticLayer& synth,
                int64_t tokens, CaseResult* r) {
  PreparedLayer& layer = *layers[0];
  const LayerSpec& spec = synth.spec;
  SyntheticInputs in;
  make_synthetic_inputs(spec, tokens, ctx.seed, &in);
  std::vector<uint8_t> output(in.inputs.input.bytes(), 0);
  MutableTensorView out(output.data(), spec.act_dtype, {tokens, spec.hidden});
  std::vector<double> us;
  QMOE_RETURN_IF_ERROR(time_case(ctx, layers, in.inputs, out, &us));

  r->tokens = tokens;
  r->path = layer.dispatch_choice(tokens);
  r->us_median = percentile(us, 0.5);
  r->us_p10 = percentile(us, 0.1);
  r->us_p90 = percentile(us, 0.9);
  QMOE_RETURN_IF_ERROR(
      count_touched_experts(spec, synth.weights(), in.inputs, tokens, &r->touched));
  r->bytes = static_cast<double>(r->touched) * static_cast<double>(expert_bytes(spec));
  const double seconds = r->us_median * 1e-6;
  r->gbps = seconds > 0 ? r->bytes / seconds / 1e9 : 0;
  r->tflops = seconds > 0 ? layer_flops(spec, tokens) / seconds / 1e12 : 0;

  r->budget = error_budget(spec.act_dtype, ctx.backend, fp8_calls_on(ctx.backend, ctx.options, r->path));
  if (!ctx.check) return Status::ok();
  std::vector<double> ref;
  {
    StepNote note("the fp64 oracle at " + std::to_string(tokens) + " tokens");
    QMOE_RETURN_IF_ERROR(reference_forward(spec, synth.weights(), in.inputs, &ref));
  }
  std::vector<double> got(ref.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = load_float(out.data, out.dtype, i);
  r->checked = true;
  r->error = relative_norm_error(got.data(), ref.data(), ref.size());
  r->failed = !(r->error <= r->budget);  // NaN fails
  return Status::ok();
}

std::vector<std::string> csv_row(const BenchContext& ctx, const std::string& preset,
                                 const LayerSpec& spec, const CaseResult& r) {
  const bool ceiling = ctx.ceiling.gbps > 0;
  return {preset,
          describe_formats(spec),
          dtype_name(spec.act_dtype),
          std::to_string(r.tokens),
          std::to_string(r.touched),
          num(r.bytes, "%.0f"),
          num(r.us_median, "%.3f"),
          num(r.us_p10, "%.3f"),
          num(r.us_p90, "%.3f"),
          num(r.gbps, "%.3f"),
          ceiling ? num(r.gbps / ctx.ceiling.gbps * 100, "%.2f") : "",
          num(r.tflops, "%.5f"),
          ceiling ? num(ctx.ceiling.gbps, "%.1f") : "",
          r.checked ? num(r.error, "%.3e") : "",
          num(r.budget, "%.1e"),
          r.checked ? (r.failed ? "fail" : "pass") : "skipped",
          backend_name(ctx.backend),
          ctx.device,
          ctx.timing.graph ? "yes" : "no",
          l2_label(ctx),
          std::to_string(ctx.timing.warmup),
          std::to_string(ctx.timing.repeat),
          std::to_string(ctx.seed),
          ctx.ceiling.method,
          std::to_string(spec.hidden),
          std::to_string(spec.inter),
          std::to_string(spec.num_experts),
          std::to_string(spec.routing.top_k),
          std::to_string(spec.routing.num_shared),
          r.path,
          ctx.record.commit,
          ctx.record.driver,
          ctx.record.runtime,
          settings_text(ctx.record),
          ctx.record.time_utc};
}

// The --json document: the record once, then each row as an object keyed by the CSV's columns.
std::string json_document(const BenchContext& ctx,
                          const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::string> names;
  std::string header = kHeader;
  for (size_t at = 0; at <= header.size();) {
    const size_t comma = std::min(header.find(',', at), header.size());
    names.push_back(header.substr(at, comma - at));
    at = comma + 1;
  }
  nlohmann::json doc;
  doc["qmoe"] = ctx.record.version;
  doc["commit"] = ctx.record.commit;
  doc["device"] = ctx.device;
  doc["driver"] = ctx.record.driver;
  doc["cuda_runtime"] = ctx.record.runtime;
  doc["settings"] = nlohmann::json::object();
  for (const auto& [k, v] : ctx.record.settings) doc["settings"][k] = v;
  doc["time_utc"] = ctx.record.time_utc;
  doc["rows"] = nlohmann::json::array();
  for (const auto& row : rows) {
    nlohmann::json o;
    for (size_t i = 0; i < names.size() && i < row.size(); ++i) o[names[i]] = row[i];
    doc["rows"].push_back(o);
  }
  return doc.dump(2) + "\n";
}

void print_table_header() {
  std::printf("%8s %8s %9s %10s %10s %10s %9s %7s %9s %10s  %-7s %s\n", "tokens", "experts", "MB",
              "us median", "us p10", "us p90", "GB/s", "%ceil", "TFLOP/s", "error", "check",
              "path");
}

void print_row(const BenchContext& ctx, const CaseResult& r) {
  const std::string pct = ctx.ceiling.gbps > 0 ? num(r.gbps / ctx.ceiling.gbps * 100, "%.1f") : "-";
  const std::string err = r.checked ? num(r.error, "%.3e") : "-";
  std::printf("%8lld %8lld %9.2f %10.2f %10.2f %10.2f %9.1f %7s %9.3f %10s  %-7s %s\n",
              static_cast<long long>(r.tokens), static_cast<long long>(r.touched), r.bytes / 1e6,
              r.us_median, r.us_p10, r.us_p90, r.gbps, pct.c_str(), r.tflops, err.c_str(),
              r.checked ? (r.failed ? "FAIL" : "pass") : "skipped", r.path.c_str());
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// The command
// ---------------------------------------------------------------------------------------------

struct PresetCase {
  const Preset* preset;
  LayerSpec spec;
  std::string name;  // the preset's, with the --shape override when given
};

// Every preset with the dtype and format flags applied, checked before anything is synthesized.
Status resolve_presets(const BenchArgs& a, DType dtype, std::vector<PresetCase>* out) {
  std::vector<std::string> names;
  for (const std::string& n : a.presets) {
    if (n == "all") {
      for (const Preset& p : presets()) names.push_back(p.name);
    } else {
      names.push_back(n);
    }
  }
  for (const std::string& n : names) {
    const Preset* p = find_preset(n);
    if (!p) {
      return Status::invalid("--presets: unknown preset '" + n + "' (known: " + preset_names() +
                             ", or all)");
    }
    LayerSpec spec = p->spec;
    spec.act_dtype = dtype;
    std::string name = p->name;
    if (!a.shape.empty()) {
      if (a.shape.size() != 4 || a.shape[0] < 1 || a.shape[1] < 1 || a.shape[2] < 1 ||
          a.shape[3] < 1 || a.shape[3] > a.shape[2]) {
        return Status::invalid("--shape: expected H,I,E,K with positive values and K <= E");
      }
      spec.hidden = a.shape[0];
      spec.inter = a.shape[1];
      spec.num_experts = a.shape[2];
      spec.routing.top_k = static_cast<int>(a.shape[3]);
      spec.routing.num_shared = 0;
      name += "@" + std::to_string(a.shape[0]) + "x" + std::to_string(a.shape[1]) + "x" +
              std::to_string(a.shape[2]) + "k" + std::to_string(a.shape[3]);
    }
    QMOE_RETURN_IF_ERROR(apply_format_flags(a.formats, p->name, &spec));
    QMOE_RETURN_IF_ERROR(check_spec(spec));
    out->push_back({p, spec, name});
  }
  return Status::ok();
}

std::string host_device(int threads) {
  const int n =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return "host (" + std::to_string(n) + " thread" + (n == 1 ? "" : "s") + ")";
}

// Forces one dispatch choice on every copy of the layer for one scope, then returns them to
// their tables (PreparedLayer::force_dispatch; nothing else runs on the layers meanwhile).
class ForcedChoice {
 public:
  explicit ForcedChoice(const Layers& layers) : layers_(layers) {}
  ~ForcedChoice() {
    for (PreparedLayer* l : layers_) l->force_dispatch("");
  }
  Status force(const std::string& choice) {
    for (PreparedLayer* l : layers_) QMOE_RETURN_IF_ERROR(l->force_dispatch(choice));
    return Status::ok();
  }
  ForcedChoice(const ForcedChoice&) = delete;
  ForcedChoice& operator=(const ForcedChoice&) = delete;

 private:
  const Layers& layers_;
};

// --tune: per token count, every dispatch choice the layer offers, timed as the cases are; the
// fastest median of each becomes a row of the tune file (under this layer's key and device).
Status tune_preset(const BenchContext& ctx, const BenchArgs& a, const Layers& layers,
                   const SyntheticLayer& synth) {
  PreparedLayer& layer = *layers[0];
  std::vector<int64_t> tokens = a.tokens;
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  BenchContext quick = ctx;
  quick.check = false;
  std::vector<TunedRow> rows;
  std::printf("tune     %s\n", a.tune.c_str());
  for (int64_t t : tokens) {
    const std::vector<std::string> choices = layer.dispatch_candidates(t);
    if (choices.empty()) continue;
    std::string best;
    double best_us = 0;
    std::printf("  %6lld tokens:", static_cast<long long>(t));
    for (const std::string& c : choices) {
      CaseResult r;
      {
        ForcedChoice forced(layers);
        QMOE_RETURN_IF_ERROR(forced.force(c));
        QMOE_RETURN_IF_ERROR(run_case(quick, layers, synth, t, &r));
      }
      std::printf("  %s %.2f us", c.c_str(), r.us_median);
      if (best.empty() || r.us_median < best_us) {
        best = c;
        best_us = r.us_median;
      }
    }
    std::printf("  -> %s\n", best.c_str());
    std::fflush(stdout);
    rows.push_back({t, best});
  }
  if (rows.empty()) return Status::ok();
  return save_tuned_rows(a.tune, tune_key(synth.spec, ctx.device), rows);
}

// csv: the open --csv file or nullptr; rows: every row so far (for --json).
Status bench_preset(const BenchContext& ctx, const BenchArgs& a, const PresetCase& pc,
                    std::ofstream* csv, std::vector<std::vector<std::string>>* rows,
                    bool* any_failed) {
  const LayerSpec& spec = pc.spec;
  std::printf("\n%s (%s): %s; %s; %s; %s\n", pc.name.c_str(), pc.preset->model.c_str(),
              describe_shape(spec).c_str(), describe_routing(spec).c_str(),
              describe_formats(spec).c_str(), dtype_name(spec.act_dtype));
  std::fflush(stdout);
  Clock::time_point t0 = Clock::now();
  SyntheticLayer synth;
  QMOE_RETURN_IF_ERROR(make_synthetic_layer(spec, a.seed, a.threads, &synth));
  const double synth_s = seconds_since(t0);
  const PrepareOptions& po = ctx.options;
  std::unique_ptr<PreparedLayer> layer;
  size_t used_before = 0, used_after = 0;
#ifdef QMOE_WITH_CUDA
  if (ctx.backend == BackendKind::kCuda) QMOE_RETURN_IF_ERROR(device_used_bytes(&used_before));
#endif
  // The checks prepare_layer starts with (every weight tensor scanned for non-finite values),
  // timed alone: the rest of prepare is the backend's upload and packing.
  t0 = Clock::now();
  QMOE_RETURN_IF_ERROR(check_layer(spec, synth.weights()));
  const double check_ms = seconds_since(t0) * 1e3;
  t0 = Clock::now();
  {
    StepNote note("preparing the layer");
    QMOE_RETURN_IF_ERROR(prepare_layer(ctx.backend, spec, synth.weights(), po, &layer));
  }
  const double prepare_ms = seconds_since(t0) * 1e3;
  std::string memory;
#ifdef QMOE_WITH_CUDA
  if (ctx.backend == BackendKind::kCuda) {
    QMOE_RETURN_IF_ERROR(device_used_bytes(&used_after));
    const double held = static_cast<double>(used_after) - static_cast<double>(used_before);
    const double weights =
        static_cast<double>(expert_bytes(spec)) * static_cast<double>(spec.weight_experts());
    char text[96];
    std::snprintf(text, sizeof(text), "; device memory %.1f MB (%.2fx the weights)", held / 1e6,
                  held / std::max(1.0, weights));
    memory = text;
  }
#endif
  // A second prepare of the same weights: what each further layer of a model costs, without the
  // process's one-time work (the kernels' first loads, the first pinned buffers).
  std::string again_text;
  if (ctx.backend == BackendKind::kCuda) {
    std::unique_ptr<PreparedLayer> again;
    t0 = Clock::now();
    QMOE_RETURN_IF_ERROR(prepare_layer(ctx.backend, spec, synth.weights(), po, &again));
    char text[64];
    std::snprintf(text, sizeof(text), "; a second copy %.1f ms", seconds_since(t0) * 1e3);
    again_text = text;
  }
  // --l2-flush rotate: copies of the prepared layer, each call running the next.
  std::vector<std::unique_ptr<PreparedLayer>> copies;
  Layers layers{layer.get()};
  std::string rotation;
#ifdef QMOE_WITH_CUDA
  if (ctx.backend == BackendKind::kCuda && ctx.timing.cold_l2 &&
      ctx.timing.flush == BenchTiming::Flush::kRotate) {
    const double eb = static_cast<double>(expert_bytes(spec));
    int n = 0;
    bool enough = false;
    QMOE_RETURN_IF_ERROR(rotation_copies(eb, spec.routing.top_k + spec.routing.num_shared,
                                         eb * static_cast<double>(spec.num_experts), &n, &enough));
    for (int c = 1; c < n; ++c) {
      copies.emplace_back();
      QMOE_RETURN_IF_ERROR(prepare_layer(ctx.backend, spec, synth.weights(), po, &copies.back()));
      layers.push_back(copies.back().get());
    }
    rotation = "; weights rotated over " + std::to_string(n) + " copies" +
               (enough ? "" : " (device memory holds no more: small calls may hit the L2)");
  }
#endif
  if (!a.tune.empty()) {
    QMOE_RETURN_IF_ERROR(tune_preset(ctx, a, layers, synth));
    for (PreparedLayer* l : layers) {
      QMOE_RETURN_IF_ERROR(l->apply_tune_file(a.tune));  // the cases below run the tuned table
    }
  }
  std::printf("weights synthesized in %.2f s, prepared in %.1f ms (its checks alone %.1f ms%s)%s; "
              "%.3f MB per expert%s\n",
              synth_s, prepare_ms, check_ms, again_text.c_str(), memory.c_str(),
              static_cast<double>(expert_bytes(spec)) / 1e6, rotation.c_str());
  print_table_header();
  for (int64_t tokens : a.tokens) {
    CaseResult r;
    QMOE_RETURN_IF_ERROR(run_case(ctx, layers, synth, tokens, &r));
    print_row(ctx, r);
    rows->push_back(csv_row(ctx, pc.name, spec, r));
    if (csv != nullptr) {
      *csv << csv_line(rows->back()) << '\n';
      csv->flush();
      if (!*csv) return Status::io_error("--csv: " + a.csv + ": write failed");
    }
    *any_failed = *any_failed || r.failed;
  }
  return Status::ok();
}

int run_bench(const BenchArgs& a) {
  BenchContext ctx;
  Status s = parse_backend(a.backend, &ctx.backend);
  if (!s.is_ok()) return status_error(s);
  const bool gpu = ctx.backend == BackendKind::kCuda;
  if (!gpu && a.cold_l2) {
    return usage_error("bench: --cold-l2 needs the CUDA backend (the CPU path flushes no cache)");
  }
  DType dtype = DType::kBF16;
  s = parse_act_dtype(a.dtype, "--dtype", &dtype);
  if (!s.is_ok()) return status_error(s);
  std::vector<PresetCase> cases;
  s = resolve_presets(a, dtype, &cases);
  if (!s.is_ok()) return status_error(s);

  ctx.timing.repeat = a.repeat > 0 ? a.repeat : (gpu ? 100 : 5);
  ctx.timing.warmup = a.warmup >= 0 ? a.warmup : (gpu ? 10 : 1);
  ctx.timing.cold_l2 = gpu && !a.warm_l2;
  ctx.timing.flush = a.l2_flush == "write"    ? BenchTiming::Flush::kWrite
                     : a.l2_flush == "rotate" ? BenchTiming::Flush::kRotate
                                              : BenchTiming::Flush::kRead;
  ctx.timing.graph = gpu && !a.no_graph;
  ctx.check = !a.no_check;
  ctx.seed = a.seed;
  ctx.options.num_threads = a.threads;
  s = resolve_prepare_options(ctx.options, &ctx.options);
  if (!s.is_ok()) return status_error(s);
  ctx.device = host_device(a.threads);
  // Every output path is checked before any work starts.
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"--csv", a.csv},
                                   {"--json", a.json},
                                   {"--tune", a.tune}}) {
    if (!path.empty()) s = check_output_path(flag, path);
    if (!s.is_ok()) return status_error(s);
  }
  std::ofstream csv;
  if (!a.csv.empty()) {
    s = open_csv(a.csv, &csv);
    if (!s.is_ok()) return status_error(s);
  }

#ifdef QMOE_WITH_CUDA
  if (gpu) {
    ctx.device = cuda_device_name();
    s = measure_read_ceiling(&ctx.ceiling);
    if (!s.is_ok()) return status_error(s);
  }
#endif
  ctx.record = make_record(ctx.device);
  std::printf("build    %s%s\n", version_line().c_str(),
              ctx.record.runtime.empty()
                  ? ""
                  : ("; CUDA runtime " + ctx.record.runtime + ", driver " + ctx.record.driver)
                        .c_str());
  std::printf("settings %s\n", settings_text(ctx.record).c_str());
  std::printf("started  %s\n", ctx.record.time_utc.c_str());
  std::printf("backend  %s, %s\n", backend_name(ctx.backend), ctx.device.c_str());
  std::printf("timing   %d warm-up and %d timed calls per case; %s\n", ctx.timing.warmup,
              ctx.timing.repeat,
              gpu ? (std::string(ctx.timing.graph ? "CUDA graph replays" : "eager calls") +
                     ", CUDA events, L2 " +
                     (!ctx.timing.cold_l2 ? std::string("warm")
                      : ctx.timing.flush == BenchTiming::Flush::kRotate
                          ? std::string("cold for the weights (copies rotated, nothing flushed)")
                          : std::string("flushed before each (") + a.l2_flush + " pass)"))
                        .c_str()
                  : "host clock");
  if (ctx.ceiling.gbps > 0) {
    std::printf("ceiling  %.1f GB/s read (%s, median of 20)\n", ctx.ceiling.gbps,
                ctx.ceiling.method.c_str());
  }
  if (!a.csv.empty()) std::printf("csv      %s\n", a.csv.c_str());
  if (!a.json.empty()) std::printf("json     %s\n", a.json.c_str());

  bool any_failed = false;
  std::vector<std::vector<std::string>> rows;
  for (const PresetCase& pc : cases) {
    s = bench_preset(ctx, a, pc, a.csv.empty() ? nullptr : &csv, &rows, &any_failed);
    if (!s.is_ok()) return status_error(s);
  }
  if (!a.json.empty()) {
    s = write_file_atomically("--json", a.json, json_document(ctx, rows));
    if (!s.is_ok()) return status_error(s);
  }
  if (any_failed) std::printf("\nsome cases exceed the error budget (check FAIL)\n");
  return any_failed ? kExitCheckFailed : kExitOk;
}

}  // namespace

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

Status time_cpu_case(PreparedLayer& layer, const RunInputs& in, const MutableTensorView& out,
                     const BenchTiming& timing, std::vector<double>* us) {
  int64_t tokens = 0;
  QMOE_RETURN_IF_ERROR(check_run(layer.spec(), in, out, &tokens));
  const size_t bytes = layer.workspace_size(tokens);
  AlignedBuffer ws = aligned_buffer(bytes);
  if (!ws) {
    return Status::internal("workspace: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  for (int r = 0; r < timing.warmup; ++r) {
    QMOE_RETURN_IF_ERROR(layer.run(in, out, ws.get(), bytes, nullptr, nullptr));
  }
  us->clear();
  for (int r = 0; r < timing.repeat; ++r) {
    const Clock::time_point t0 = Clock::now();
    QMOE_RETURN_IF_ERROR(layer.run(in, out, ws.get(), bytes, nullptr, nullptr));
    us->push_back(seconds_since(t0) * 1e6);
  }
  return Status::ok();
}

void add_bench_command(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "time preset layers over token counts (decode and prefill): us per call, GB/s of the "
      "experts touched against the device's read ceiling, TFLOP/s, error against the fp64 "
      "oracle; a table and a CSV");
  cmd->add_option("--presets,--preset", a->presets,
                  "comma-separated model shapes: " + preset_names() + ", or all")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--shape", a->shape,
                  "H,I,E,K: run the presets' routing and activation at this hidden size, "
                  "intermediate size, expert count and top-k (shared experts dropped)")
      ->delimiter(',')
      ->expected(4);
  cmd->add_option("--tokens", a->tokens, "comma-separated tokens per call")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "activation dtype: f32, f16 or bf16")->capture_default_str();
  add_format_flags(cmd, &a->formats);
  cmd->add_option("--backend", a->backend, "auto, cpu or cuda (auto: cuda when available)")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads for synthesis and the CPU backend (0: all)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_option("--repeat", a->repeat, "timed calls per case (0: 100 on the GPU, 5 on the CPU)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "untimed calls per case (default: 10 GPU, 1 CPU)")
      ->check(CLI::Range(0, 100000));
  cmd->add_option("--csv", a->csv,
                  "append one row per case to this CSV file (the header once); without it no "
                  "file is written");
  cmd->add_option("--json", a->json,
                  "write the rows and the run's record (commit, device, driver, settings, time) "
                  "to this JSON file");
  CLI::Option* cold =
      cmd->add_flag("--cold-l2", a->cold_l2, "flush the L2 before each timed call (the default)");
  CLI::Option* warm =
      cmd->add_flag("--warm-l2", a->warm_l2, "no L2 flush: weights may stay in the L2");
  cold->excludes(warm);
  cmd->add_option("--l2-flush", a->l2_flush,
                  "how the cold L2 is made: read (a read pass leaves clean lines, like the read "
                  "ceiling's), write (a memset leaves dirty lines, whose write-back the timed "
                  "call pays) or rotate (no flush: the calls cycle through copies of the weights, "
                  "so the code and the small inputs stay cached, as between a model's layers)")
      ->check(CLI::IsMember({"read", "write", "rotate"}))
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "seed of the synthetic weights and inputs")
      ->capture_default_str();
  cmd->add_flag("--no-graph", a->no_graph, "time eager run() calls instead of graph replays");
  cmd->add_flag("--no-check", a->no_check, "skip the comparison with the fp64 oracle");
  cmd->add_option("--tune", a->tune,
                  "time every dispatch choice per token count first, store the fastest in this "
                  "tune file (see QMOE_TUNE_FILE), then run the cases with it");
  cmd->footer(std::string(
                 "Examples:\n"
                 "  qmoe bench --presets qwen3-30b-a3b --tokens 1,8,64\n"
                 "  qmoe bench --presets mixtral-8x7b --format int8 --tokens 1,4 --csv runs.csv\n"
                 "  qmoe bench --presets qwen3-30b-a3b --tokens 64,128,256 --tune tune.json\n"
                 "  QMOE_DISPATCH=generic qmoe bench --tokens 8 --json generic.json\n") +
             kExitCodesHelp);
  cmd->callback([a, exit_code] { *exit_code = run_bench(*a); });
}

}  // namespace qmoe::cli

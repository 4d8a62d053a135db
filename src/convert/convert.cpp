// The conversion driver: validate the whole checkpoint, lay the pack out, then convert one layer
// after another, its experts in parallel, each expert written to its slice of the pack as soon as
// it is done. Memory: one expert's fp32 staging and quantized copy per worker.
#include "qmoe/convert.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "convert/checkpoint.h"
#include "convert/experts.h"
#include "convert/pack_writer.h"
#include "core/numeric.h"
#include "cpu/thread_pool.h"

namespace qmoe {

namespace {

using convert::ExpertScratch;
using convert::ExpertStats;
using convert::LayerSource;
using convert::PackWriter;

constexpr size_t kMaxNotes = 8;  // requantized experts named one by one; the rest counted

std::string layer_key(int layer, const std::string& name) {
  return "layers." + std::to_string(layer) + "." + name;
}

// The ORT tensors of one FC, in the order ORT numbers them.
struct FcNames {
  int weight, scales, zero_points, global_scale;
};
constexpr FcNames kFc1Names{kOrtFc1Weights, kOrtFc1Scales, kOrtFc1ZeroPoints, kOrtFc1GlobalScale};
constexpr FcNames kFc2Names{kOrtFc2Weights, kOrtFc2Scales, kOrtFc2ZeroPoints, kOrtFc2GlobalScale};

void declare_fc(PackWriter* w, int layer, const FcNames& names, const FcFormat& f, int64_t e,
                int64_t n, int64_t k) {
  const FcTensorShapes s = fc_tensor_shapes(f, e, n, k);
  auto decl = [&](int ort, DType t, const int64_t* d, int rank) {
    const std::string name = layer_key(layer, ort_input_name(ort));
    if (rank == 1) w->declare(name, t, {d[0]});
    if (rank == 2) w->declare(name, t, {d[0], d[1]});
    if (rank == 3) w->declare(name, t, {d[0], d[1], d[2]});
  };
  decl(names.weight, s.weight_dtype, s.weight, s.weight_rank);
  decl(names.scales, s.scale_dtype, s.scale, s.scale_rank);
  decl(names.zero_points, DType::kU8, s.zero_point, s.zero_point_rank);
  if (s.global_scale) decl(names.global_scale, DType::kF32, &e, 1);
}

// Writes expert e's slice of each tensor of one FC (every layout has the expert dimension first).
Status write_fc(PackWriter* w, int layer, const FcNames& names, const QuantizedFc& q, int64_t e) {
  auto put = [&](int ort, const void* data, size_t bytes) {
    if (bytes == 0) return Status::ok();
    return w->write(layer_key(layer, ort_input_name(ort)), data, bytes,
                    static_cast<uint64_t>(e) * bytes);
  };
  QMOE_RETURN_IF_ERROR(put(names.weight, q.weight.data(), q.weight.size()));
  QMOE_RETURN_IF_ERROR(put(names.scales, q.scales.data(), q.scales.size()));
  QMOE_RETURN_IF_ERROR(put(names.zero_points, q.zero_points.data(), q.zero_points.size()));
  return put(names.global_scale, q.global_scale.data(), q.global_scale.size() * sizeof(float));
}

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> r(static_cast<size_t>(v.numel()));
  convert::widen(v, r.data());
  return r;
}

// router_weight [E, H]: the routed experts' rows, then one row for each shared expert (the
// shared gate where the model weights them by it).
Status write_router(PackWriter* w, const LayerSource& l) {
  std::vector<float> r = to_f32(l.router);
  const size_t hidden = static_cast<size_t>(l.router.dims[1]);
  const std::vector<float> gate =
      l.shared_gate.present() ? to_f32(l.shared_gate) : std::vector<float>(hidden, 0.0f);
  while (r.size() < l.experts.size() * hidden) r.insert(r.end(), gate.begin(), gate.end());
  QMOE_RETURN_IF_ERROR(
      w->write(layer_key(l.index, "router_weight"), r.data(), r.size() * sizeof(float)));
  const std::pair<const TensorView*, const char*> biases[2] = {
      {&l.router_bias, kRouterCorrectionBiasName}, {&l.router_logit_bias, "router_bias"}};
  for (const auto& [view, name] : biases) {
    if (!view->present()) continue;
    const std::vector<float> b = to_f32(*view);
    QMOE_RETURN_IF_ERROR(w->write(layer_key(l.index, name), b.data(), b.size() * sizeof(float)));
  }
  return Status::ok();
}

// Writes expert e's slice of an FC bias ([E, N] f32) when the layer has one.
Status write_bias(PackWriter* w, int layer, int ort, const std::vector<float>& b, int64_t e) {
  if (b.empty()) return Status::ok();
  const size_t bytes = b.size() * sizeof(float);
  return w->write(layer_key(layer, ort_input_name(ort)), b.data(), bytes,
                  static_cast<uint64_t>(e) * bytes);
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int i : v) s += (s.empty() ? "" : ",") + std::to_string(i);
  return s;
}

Status pack_metadata(const convert::Checkpoint& c, const ConvertOptions& o, const LayerSpec& spec,
                     std::map<std::string, std::string>* out) {
  std::map<std::string, std::string> layer;
  QMOE_RETURN_IF_ERROR(layer_file_metadata(spec, &layer));
  for (int l : c.config().moe_layers) {
    for (const auto& kv : layer) (*out)[layer_key(l, kv.first)] = kv.second;
  }
  (*out)["qmoe.pack_version"] = kPackFormatVersion;
  (*out)["qmoe.layers"] = join(c.config().moe_layers);
  (*out)["qmoe.model_type"] = c.config().model_type;
  (*out)["qmoe.converted_from"] = source_format_name(o.from);
  return Status::ok();
}

Status convert_layer(const convert::Checkpoint& ckpt, const LayerSource& l, const ConvertOptions& o,
                     const MoeModelConfig& cfg, cpu::ThreadPool* pool,
                     std::vector<ExpertScratch>* scratch, PackWriter* w, ConvertReport* r) {
  QMOE_RETURN_IF_ERROR(write_router(w, l));
  ckpt.release(l.router);
  std::mutex mu;
  Status first;
  pool->parallel_for(static_cast<int64_t>(l.experts.size()), [&](int64_t e, int worker) {
    ExpertStats stats;
    ExpertScratch& s = (*scratch)[static_cast<size_t>(worker)];
    const convert::ExpertTensors& t = l.experts[static_cast<size_t>(e)];
    Status st = t.slices > 1 ? convert::convert_slice(t, o.from, cfg, &s, &stats)
                             : convert::convert_expert(t, o.from, cfg, &s, &stats);
    if (st.is_ok()) st = write_fc(w, l.index, kFc1Names, s.fc1, e);
    if (st.is_ok()) st = write_fc(w, l.index, kFc2Names, s.fc2, e);
    if (st.is_ok()) st = write_bias(w, l.index, kOrtFc1Bias, s.b1, e);
    if (st.is_ok()) st = write_bias(w, l.index, kOrtFc2Bias, s.b2, e);
    convert::release_expert(ckpt, l.experts[static_cast<size_t>(e)]);
    std::lock_guard<std::mutex> lock(mu);
    if (!st.is_ok() && first.is_ok()) first = st;
    r->experts_reordered += stats.reordered ? 1 : 0;
    r->experts_act_order_requantized += stats.act_order_requantized ? 1 : 0;
    if (stats.requantized) {
      ++r->experts_requantized;
      r->max_requant_error = std::max(r->max_requant_error, stats.requant_error);
      if (r->notes.size() < kMaxNotes) {
        char err[32];
        std::snprintf(err, sizeof(err), "%.3e", stats.requant_error);
        r->notes.push_back("requantized layer " + std::to_string(l.index) + " expert " +
                           std::to_string(e) + ": relative-norm error " + err +
                           (stats.act_order_requantized ? " (act-order g_idx)" : ""));
      }
    }
  });
  return first;
}

// Float sources have no quantization_config; a quantized source's --from name is its
// quant_method, except ModelOpt's ("modelopt", read as --from nvfp4).
bool is_quantized(SourceFormat f) {
  return f != SourceFormat::kBf16 && f != SourceFormat::kFp16 && f != SourceFormat::kFp32;
}

std::string quant_method_of(SourceFormat f) {
  if (!is_quantized(f)) return "";
  return f == SourceFormat::kNvfp4 ? "modelopt" : source_format_name(f);
}

// --from must name what config.json's quantization_config says the checkpoint holds.
Status check_source(const MoeModelConfig& cfg, SourceFormat from, const std::string& config) {
  const std::string given = source_format_name(from), want = quant_method_of(from);
  if (want == cfg.quant_method) return Status::ok();
  if (cfg.quant_method.empty()) {
    return Status::invalid(config + ": --from " + given +
                           ", but there is no quantization_config with quant_method " + want +
                           (from == SourceFormat::kNvfp4 ? " (nor an hf_quant_config.json)" : ""));
  }
  // parse_model_config accepts only the quant_methods that name a --from.
  const std::string right = cfg.quant_method == "modelopt" ? "nvfp4" : cfg.quant_method;
  return Status::invalid(config + ": the checkpoint is " + cfg.quant_method +
                         "-quantized; convert it with --from " + right + ", not --from " + given);
}

}  // namespace

Status convert_checkpoint(const ConvertOptions& o, ConvertReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<convert::Checkpoint> ckpt;
  QMOE_RETURN_IF_ERROR(convert::Checkpoint::open(o.src, &ckpt));
  const MoeModelConfig& cfg = ckpt->config();
  const std::string config_path = o.src + "/config.json";
  if (cfg.moe_layers.empty()) return Status::invalid(config_path + ": no layer has an MoE block");
  QMOE_RETURN_IF_ERROR(check_source(cfg, o.from, config_path));
  // Square FP8 blocks span rows: FC1 stacks [gate; up] so that every block of FC1 is a block of
  // one projection.
  const int64_t block = o.from == SourceFormat::kFp8 ? cfg.fp8.block
                        : (o.from == SourceFormat::kCompressedTensors && cfg.ct.fp8)
                            ? cfg.ct.group_size
                            : 0;
  if (block > 0 && cfg.inter % block != 0) {
    return Status::unsupported(config_path + ": the expert intermediate size " +
                               std::to_string(cfg.inter) + " is not a multiple of the FP8 block " +
                               std::to_string(block) +
                               ": gate and up blocks would share scales in FC1");
  }
  // Everything is resolved and checked before the first byte is written.
  std::vector<LayerSource> layers(cfg.moe_layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    QMOE_RETURN_IF_ERROR(resolve_layer(*ckpt, o.from, cfg.moe_layers[i], &layers[i]));
  }
  ConvertReport r;
  r.fc1 = o.fc1;
  r.fc2 = o.fc2;
  if (is_quantized(o.from)) {
    r.fc1 = r.fc2 =
        convert::quantized_fc_format(cfg, o.from, layers[0].experts[0].gate.scales.dtype);
  }
  LayerSpec spec = moe_layer_spec(cfg, r.fc1, r.fc2);
  if (block > 0) spec.activation.glu = GluLayout::kConcatenated;
  Status s = check_spec(spec);
  if (!s.is_ok()) return Status(s.code(), o.src + ": " + s.message());

  std::map<std::string, std::string> metadata;
  QMOE_RETURN_IF_ERROR(pack_metadata(*ckpt, o, spec, &metadata));
  PackWriter w(o.out);
  for (int l : cfg.moe_layers) {
    declare_fc(&w, l, kFc1Names, spec.fc1, spec.num_experts, spec.fc1_rows(), spec.hidden);
    declare_fc(&w, l, kFc2Names, spec.fc2, spec.num_experts, spec.hidden, spec.inter);
    w.declare(layer_key(l, "router_weight"), DType::kF32, {spec.num_experts, spec.hidden});
    if (layers[0].router_bias.present()) {  // the routed experts' only
      w.declare(layer_key(l, kRouterCorrectionBiasName), DType::kF32, {cfg.num_experts});
    }
    if (layers[0].router_logit_bias.present()) {
      w.declare(layer_key(l, "router_bias"), DType::kF32, {spec.num_experts});
    }
    if (spec.has_fc1_bias) {
      w.declare(layer_key(l, ort_input_name(kOrtFc1Bias)), DType::kF32,
                {spec.num_experts, spec.fc1_rows()});
    }
    if (spec.has_fc2_bias) {
      w.declare(layer_key(l, ort_input_name(kOrtFc2Bias)), DType::kF32,
                {spec.num_experts, spec.hidden});
    }
  }
  QMOE_RETURN_IF_ERROR(w.begin(metadata));

  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::ThreadPool pool(threads);
  std::vector<ExpertScratch> scratch(static_cast<size_t>(pool.size()));
  for (ExpertScratch& sc : scratch) {
    QMOE_RETURN_IF_ERROR(allocate_fc(spec.fc1, 1, spec.fc1_rows(), spec.hidden, &sc.fc1));
    QMOE_RETURN_IF_ERROR(allocate_fc(spec.fc2, 1, spec.hidden, spec.inter, &sc.fc2));
  }
  int64_t total = 0;
  for (const LayerSource& l : layers) total += l.source_bytes;
  for (size_t i = 0; i < layers.size(); ++i) {
    QMOE_RETURN_IF_ERROR(convert_layer(*ckpt, layers[i], o, cfg, &pool, &scratch, &w, &r));
    r.source_bytes += layers[i].source_bytes;
    if (o.progress) {
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double rate = r.source_bytes / std::max(sec, 1e-9);
      std::fprintf(stderr, "\rconvert: layer %zu/%zu, %.2f of %.2f GB, %.2f GB/s, ETA %.0f s   ",
                   i + 1, layers.size(), r.source_bytes / 1e9, total / 1e9, rate / 1e9,
                   (total - r.source_bytes) / std::max(rate, 1.0));
      std::fflush(stderr);
    }
  }
  if (o.progress) std::fprintf(stderr, "\n");
  QMOE_RETURN_IF_ERROR(w.commit());
  r.layers = static_cast<int>(layers.size());
  r.pack_bytes = static_cast<int64_t>(w.file_bytes());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.experts_reordered > 0) {
    r.notes.push_back("act-order: " + std::to_string(r.experts_reordered) +
                      " expert(s) had their intermediate index reordered (FC1 rows, FC2 columns) "
                      "so that down_proj's g_idx groups are contiguous blocks; exact");
  }
  if (r.experts_act_order_requantized > 0) {
    r.notes.push_back(
        "act-order: " + std::to_string(r.experts_act_order_requantized) +
        " expert(s) had a g_idx with no contiguous equivalent (gate/up_proj's permute the hidden "
        "size, the fixed input order); those FCs were requantized from GPTQ's dequantization "
        "with qmoe's quantizer");
  }
  if (r.experts_requantized > r.experts_act_order_requantized) {
    std::string why =
        " expert(s) had GPTQ zero points no qmoe format holds (e.g. a v1 zero stored as 15, "
        "meaning 16) and were requantized from GPTQ's dequantization";
    if (o.from == SourceFormat::kNvfp4) {
      why =
          " expert(s) had gate and up projections with different weight_scale_2; FC1 holds "
          "one global scale, so it was requantized from the NVFP4 dequantization";
    } else if (o.from == SourceFormat::kCompressedTensors && cfg.ct.fp8_tensor) {
      why =
          " expert(s) had gate and up projections with different FP8 tensor scales; FC1 holds "
          "one global scale, so it was requantized from the FP8 dequantization";
    } else if (o.from == SourceFormat::kCompressedTensors && cfg.ct.fp8) {
      why =
          " expert(s) had per-channel FP8 scales, which no qmoe format holds; they were "
          "requantized into fp8_block from the FP8 dequantization";
    }
    r.notes.push_back(std::to_string(r.experts_requantized - r.experts_act_order_requantized) +
                      why);
  }
  *report = std::move(r);
  return Status::ok();
}

}  // namespace qmoe

// Reading model packs (docs/model-pack.md): layer N is the layer file whose tensors and metadata
// keys carry the prefix `layers.N.`, plus its router weight (and bias, where the model has one).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/tensor_check.h"
#include "io/layer_metadata.h"
#include "qmoe/convert.h"

namespace qmoe {

namespace {

Status parse_layer_list(const std::string& path, const std::string& text, std::vector<int>* out) {
  out->clear();
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 1000000 ||
        (!out->empty() && v <= out->back())) {
      return Status::invalid(path +
                             ": metadata qmoe.layers: expected increasing layer indices "
                             "separated by commas, got '" +
                             text + "'");
    }
    out->push_back(static_cast<int>(v));
    pos = comma + 1;
  }
  return Status::ok();
}

}  // namespace

Status ModelPack::open(const std::string& path, std::unique_ptr<ModelPack>* out) {
  std::unique_ptr<ModelPack> p(new ModelPack());
  QMOE_RETURN_IF_ERROR(SafetensorsFile::open(path, &p->file_));
  const auto& meta = p->file_->metadata();
  auto version = meta.find("qmoe.pack_version");
  if (version == meta.end()) {
    return Status::invalid(path +
                           ": not a qmoe model pack (no metadata qmoe.pack_version; "
                           "a layer file runs with --layer alone)");
  }
  if (version->second != kPackFormatVersion) {
    return Status::unsupported(path + ": pack version '" + version->second +
                               "', this build reads " + kPackFormatVersion);
  }
  auto layers = meta.find("qmoe.layers");
  QMOE_RETURN_IF_ERROR(
      parse_layer_list(path, layers == meta.end() ? std::string() : layers->second, &p->layers_));
  for (const auto& kv : meta) {
    if (kv.first.rfind("layers.", 0) != 0) p->info_.insert(kv);
  }
  *out = std::move(p);
  return Status::ok();
}

Status ModelPack::layer(int index, PackLayer* out) const {
  const std::string& path = file_->path();
  if (std::find(layers_.begin(), layers_.end(), index) == layers_.end()) {
    std::string known;
    for (int l : layers_) known += (known.empty() ? "" : ", ") + std::to_string(l);
    return Status::invalid(path + ": no MoE layer " + std::to_string(index) + " (layers: " + known +
                           ")");
  }
  const std::string prefix = "layers." + std::to_string(index) + ".";
  const std::string where = path + ": layer " + std::to_string(index) + ": ";
  std::map<std::string, std::string> meta;
  for (const auto& kv : file_->metadata()) {
    if (kv.first.rfind(prefix, 0) == 0) meta[kv.first.substr(prefix.size())] = kv.second;
  }
  std::vector<std::pair<std::string, TensorView>> tensors;
  TensorView router, bias;
  for (const std::string& name : file_->names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string local = name.substr(prefix.size());
    if (local == "router_weight") {
      router = *file_->find(name);
    } else if (local == "router_bias") {
      bias = *file_->find(name);
    } else {
      tensors.emplace_back(local, *file_->find(name));
    }
  }
  LoadedLayer l;
  Status s = layer_from_parts(meta, tensors, &l);
  if (!s.is_ok()) return Status(s.code(), where + s.message());
  const int64_t dims[2] = {l.spec.num_experts, l.spec.hidden};
  s = expect_tensor(router, prefix + "router_weight", DType::kF32, dims, 2);
  if (s.is_ok()) s = expect_finite(router, prefix + "router_weight");
  if (s.is_ok() && bias.present()) {
    s = expect_tensor(bias, prefix + "router_bias", DType::kF32, dims, 1);
    if (s.is_ok()) s = expect_finite(bias, prefix + "router_bias");
  }
  if (!s.is_ok()) return Status(s.code(), path + ": " + s.message());
  out->index = index;
  out->spec = l.spec;
  out->weights = l.weights;
  out->router_weight = router;
  out->router_bias = bias;
  return Status::ok();
}

Status router_logits(const TensorView& x, const TensorView& router_weight,
                     const TensorView& router_bias, DType out_dtype, std::vector<uint8_t>* out,
                     TensorView* view) {
  if (x.rank != 2 || router_weight.rank != 2 || x.dims[1] != router_weight.dims[1] ||
      router_weight.dtype != DType::kF32) {
    return Status::invalid("router logits: input " + x.shape_string() +
                           " does not match router_weight f32 " + router_weight.shape_string() +
                           " (expected input [T, H], router_weight [E, H])");
  }
  if (out_dtype != DType::kF32 && out_dtype != DType::kF16 && out_dtype != DType::kBF16) {
    return Status::invalid(std::string("router logits: dtype ") + dtype_name(out_dtype) +
                           ", expected f32, f16 or bf16");
  }
  const int64_t t = x.dims[0], h = x.dims[1], e = router_weight.dims[0];
  if (router_bias.present() &&
      (router_bias.dtype != DType::kF32 || router_bias.rank != 1 || router_bias.dims[0] != e)) {
    return Status::invalid("router logits: router_bias " + router_bias.shape_string() +
                           ", expected f32 [" + std::to_string(e) + "]");
  }
  const auto* w = static_cast<const float*>(router_weight.data);
  const auto* bias = static_cast<const float*>(router_bias.data);
  out->assign(static_cast<size_t>(t * e) * dtype_size(out_dtype), 0);
  std::vector<double> xr(static_cast<size_t>(h));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < h; ++j) xr[j] = load_float(x.data, x.dtype, i * h + j);
    for (int64_t c = 0; c < e; ++c) {
      double acc = bias ? bias[c] : 0.0;
      for (int64_t j = 0; j < h; ++j) acc += xr[j] * w[c * h + j];
      const float f = static_cast<float>(acc);
      uint8_t* dst = out->data() + static_cast<size_t>(i * e + c) * dtype_size(out_dtype);
      if (out_dtype == DType::kF32) {
        std::memcpy(dst, &f, 4);
      } else {
        const uint16_t b = out_dtype == DType::kF16 ? num::f32_to_f16(f) : num::f32_to_bf16(f);
        std::memcpy(dst, &b, 2);
      }
    }
  }
  *view = TensorView(out->data(), out_dtype, {t, e});
  return Status::ok();
}

}  // namespace qmoe

#include "convert/checkpoint.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace qmoe::convert {

namespace {

Status read_text(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) return Status::io_error(path + ": read failed");
  *out = s.str();
  return Status::ok();
}

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

Status parse_index(const std::string& json_text, const std::string& where,
                   std::map<std::string, std::string>* shard_of) {
  auto j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid(where + ": not valid JSON");
  if (!j.is_object()) return Status::invalid(where + ": expected a JSON object");
  auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object()) {
    return Status::invalid(where + ": missing 'weight_map' (an object of tensor -> shard file)");
  }
  shard_of->clear();
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      return Status::invalid(where + ": weight_map['" + it.key() +
                             "']: expected a file name, got " + it->dump());
    }
    const std::string file = it->get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return Status::invalid(where + ": weight_map['" + it.key() + "']: '" + file +
                             "' is not a file name in the checkpoint directory");
    }
    (*shard_of)[it.key()] = file;
  }
  return Status::ok();
}

Status Checkpoint::open(const std::string& dir, std::unique_ptr<Checkpoint>* out) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  c->dir_ = dir;
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return Status::io_error(dir +
                            ": cannot open the checkpoint directory: " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) return Status::io_error(dir + ": not a directory");
  const std::string config_path = dir + "/config.json";
  std::string text;
  QMOE_RETURN_IF_ERROR(read_text(config_path, &text));
  QMOE_RETURN_IF_ERROR(parse_model_config(text, config_path, &c->config_));
  const std::string hf_quant = dir + "/hf_quant_config.json";
  if (c->config_.quant_method.empty() && is_file(hf_quant)) {
    QMOE_RETURN_IF_ERROR(read_text(hf_quant, &text));
    QMOE_RETURN_IF_ERROR(parse_hf_quant_config(text, hf_quant, &c->config_));
  }

  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single = "model.safetensors";
  if (is_file(index_path)) {
    QMOE_RETURN_IF_ERROR(read_text(index_path, &text));
    QMOE_RETURN_IF_ERROR(parse_index(text, index_path, &c->shard_of_));
    c->listing_ = index_path;
    std::set<std::string> checked;
    for (const auto& kv : c->shard_of_) {
      if (!checked.insert(kv.second).second) continue;
      if (!is_file(dir + "/" + kv.second)) {
        return Status::io_error(dir + "/" + kv.second + ": missing shard (" + index_path +
                                " places tensor '" + kv.first + "' in it)");
      }
    }
  } else if (is_file(dir + "/" + single)) {
    std::unique_ptr<SafetensorsFile> f;
    QMOE_RETURN_IF_ERROR(SafetensorsFile::open(dir + "/" + single, &f));
    for (const std::string& name : f->names()) c->shard_of_[name] = single;
    c->listing_ = dir + "/" + single;
    c->shards_[single] = std::move(f);
  } else {
    return Status::io_error(dir + ": neither model.safetensors.index.json nor model.safetensors");
  }
  *out = std::move(c);
  return Status::ok();
}

Status Checkpoint::tensor(const std::string& name, TensorView* out, std::string* file) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    return Status::invalid(listing_ + ": missing tensor '" + name + "'");
  }
  const std::string path = dir_ + "/" + it->second;
  if (file) *file = path;
  const SafetensorsFile* shard = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = shards_[it->second];
    if (!slot) QMOE_RETURN_IF_ERROR(SafetensorsFile::open(path, &slot));
    shard = slot.get();
  }
  const TensorView* v = shard->find(name);
  if (!v) {
    return Status::invalid(path + ": missing tensor '" + name +
                           "' (model.safetensors.index.json places it in this shard)");
  }
  *out = *v;
  return Status::ok();
}

Status Checkpoint::expect(const std::string& name, DType dtype,
                          std::initializer_list<int64_t> shape, TensorView* out) const {
  std::string file;
  QMOE_RETURN_IF_ERROR(tensor(name, out, &file));
  const TensorView want(out->data, dtype, shape);
  bool same = out->dtype == dtype && out->rank == want.rank;
  for (int i = 0; same && i < want.rank; ++i) same = out->dims[i] == want.dims[i];
  if (!same) {
    return Status::invalid(file + ": tensor '" + name + "': expected " +
                           safetensors_dtype_name(dtype) + " " + want.shape_string() + ", got " +
                           safetensors_dtype_name(out->dtype) + " " + out->shape_string());
  }
  return Status::ok();
}

void Checkpoint::release(const TensorView& view) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : shards_) {
    if (kv.second) kv.second->release(view);
  }
}

}  // namespace qmoe::convert

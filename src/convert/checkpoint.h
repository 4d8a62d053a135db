// A Hugging Face checkpoint directory: config.json, and safetensors shards found through
// model.safetensors.index.json (or one model.safetensors). Shards are mapped lazily, on the first
// tensor read from them; every error names the file and the tensor.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "qmoe/convert.h"
#include "qmoe/io.h"

namespace qmoe::convert {

class Checkpoint {
 public:
  // Reads config.json and the index, and checks that every shard the index names exists.
  static Status open(const std::string& dir, std::unique_ptr<Checkpoint>* out);

  const MoeModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return shard_of_.count(name) != 0; }
  // The tensor's view (mapping its shard on first use); *file receives the shard's path.
  // Thread-safe.
  Status tensor(const std::string& name, TensorView* out, std::string* file) const;
  // Drops the mapped pages under a view read from one of the shards (SafetensorsFile::release).
  void release(const TensorView& view) const;
  // The same, checking dtype and shape; the message names file, tensor, expected and found.
  Status expect(const std::string& name, DType dtype, std::initializer_list<int64_t> shape,
                TensorView* out) const;

 private:
  std::string dir_;
  std::string listing_;  // the file that lists the tensors: the index, or model.safetensors
  MoeModelConfig config_;
  std::map<std::string, std::string> shard_of_;  // tensor name -> shard file name
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_;
};

// Parses an older ModelOpt export's hf_quant_config.json ({"quantization": {"quant_algo":
// "NVFP4", "group_size": 16}}), read when config.json has no quantization_config.
Status parse_hf_quant_config(const std::string& json_text, const std::string& where,
                             MoeModelConfig* c);

// Parses model.safetensors.index.json's text into tensor name -> shard file name. Shard names must
// be plain file names (no directories), so a checkpoint never reads outside its directory.
Status parse_index(const std::string& json_text, const std::string& where,
                   std::map<std::string, std::string>* shard_of);

}  // namespace qmoe::convert

// qmoe: file I/O. A safetensors reader (memory-mapped, validated before any view is handed out) and
// writer, and on top of them the layer file (one QMoE layer: ORT input tensors + ORT attributes in
// __metadata__, see docs/layer-file.md) and the input/output files the CLI runs on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qmoe/layer.h"
#include "qmoe/ort.h"
#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe {

// ---- safetensors ----

// Headers larger than this are rejected before they are parsed (the format's reference
// implementation uses the same bound).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100000000;

// safetensors dtype strings ("F32", "BF16", "F8_E4M3", ...) <-> DType.
const char* safetensors_dtype_name(DType t);
bool parse_safetensors_dtype(const std::string& name, DType* out);

// A safetensors file mapped read-only. open() validates the whole header (sizes, offsets, overlaps,
// dtypes, metadata) first, so every view it hands out lies inside the file and has exactly the
// bytes its dtype and shape imply. Views stay valid while the object lives.
class SafetensorsFile {
 public:
  static Status open(const std::string& path, std::unique_ptr<SafetensorsFile>* out);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names in the order of their data in the file.
  const std::vector<std::string>& names() const { return names_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // nullptr when the file has no such tensor.
  const TensorView* find(const std::string& name) const;
  // An error naming the file and the tensor when it is missing.
  Status get(const std::string& name, TensorView* out) const;
  // Lets the kernel drop the mapped pages under a view of this file once it has been read (they
  // are re-read from the file if touched again), so that streaming over a large file keeps the
  // resident set small. A view that is not inside the mapping (another file's, an aligned copy)
  // is ignored.
  void release(const TensorView& view) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
  // Copies of tensors whose offset is not a multiple of their element size (the format allows it;
  // typed access needs alignment).
  std::vector<std::unique_ptr<uint8_t[]>> aligned_copies_;
};

struct NamedTensor {
  std::string name;
  TensorView view;  // must be present
};

// Writes a standard safetensors file: 8-byte little-endian header length, the JSON header padded
// with spaces to a multiple of 8 bytes, then the tensors back to back with no gaps. Tensors are
// stored in order of decreasing element size (stable), so every tensor starts at a multiple of its
// element size. The file is written to a temporary name and renamed into place.
Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// ---- layer files ----

// The layer file's format version (metadata key qmoe.format_version).
constexpr const char* kLayerFileFormatVersion = "1";
// The optional tensor holding the kGroupedTopK correction bias, f32 [E - num_shared].
constexpr const char* kRouterCorrectionBiasName = "router_correction_bias";

// A layer read from a file. spec and weights point into the mapping held by `file`.
struct LoadedLayer {
  std::unique_ptr<SafetensorsFile> file;
  OrtQMoEAttributes attributes;
  OrtImportOptions import_options;
  LayerSpec spec;
  LayerWeights weights;
};

// Reads a layer file: the ORT attributes from __metadata__, the ORT input tensors by name, then the
// qmoe.* keys on top of what layer_from_ort() built, then check_layer(). spec.act_dtype is the
// dtype of the biases when there are any, else f32; the inputs of a call decide it otherwise.
Status load_layer_file(const std::string& path, LoadedLayer* out);

// Writes a layer file for spec and weights. Fails with kUnsupported for a spec that ORT's
// attributes plus the qmoe.* keys cannot express (e.g. FC1 and FC2 with different block sizes).
Status save_layer_file(const std::string& path, const LayerSpec& spec, const LayerWeights& weights);

// The ORT attributes and qmoe.* metadata that save_layer_file() writes for spec.
Status layer_file_metadata(const LayerSpec& spec, std::map<std::string, std::string>* metadata);

// ---- input / output files ----

// A call's inputs read from a file: `input` [T, H], `router_probs` [T, E] and optionally
// `router_weights` [T, E]; the views point into `file`.
struct LoadedInputs {
  std::unique_ptr<SafetensorsFile> file;
  RunInputs inputs;
};
Status load_input_file(const std::string& path, LoadedInputs* out);
Status save_input_file(const std::string& path, const RunInputs& inputs);

// `output` [T, H] in the input's dtype.
Status save_output_file(const std::string& path, const TensorView& output);

}  // namespace qmoe

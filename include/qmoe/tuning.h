// Tuned dispatch: a backend may run a call down one of several kernel paths (the CUDA backend:
// the decode kernel, the fused decode kernel, or the generic path, there with the mixed-input
// GEMM's tile named or left to the layer). Each backend has an
// analytic default; a tune file records, per layer shape and device, the path measured fastest
// for each token count, and prepare_layer() applies it (PrepareOptions::tune_file, or the
// QMOE_TUNE_FILE environment variable). `qmoe bench --tune FILE` measures and writes one.
//
// A file is JSON: {"qmoe_tune": 1, "layers": {KEY: [{"max_tokens": 1, "choice": "decode/1"},
// ...]}}. A row covers calls of more tokens than the previous row's max_tokens, up to its own;
// calls beyond the last row keep the backend's default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe {

struct TunedRow {
  int64_t max_tokens = 0;
  std::string choice;  // a backend's choice name: dispatch_choice_names()
};

// The key a layer's rows are stored under: the device, then everything in the spec that changes
// the kernels' cost (formats, sizes, dtype, activation layout, routes per token, a shard's local
// experts).
std::string tune_key(const LayerSpec& spec, const std::string& device);

// Reads the rows stored under `key`. A missing file or key is not an error (*found = false); a
// file that is not a tune file, or rows out of order, is.
Status load_tuned_rows(const std::string& path, const std::string& key, std::vector<TunedRow>* rows,
                       bool* found);

// Every dispatch choice name there is ("generic", "decode/1", "fused", "generic/32",
// "generic/64", "generic/128", "generic/144": the CUDA backend's paths and the generic path's
// mixed-input tiles, src/cuda/layer/dispatch.h), and them as a message: "generic, decode/1, ...
// or generic/144".
const std::vector<std::string>& dispatch_choice_names();
std::string dispatch_choice_list();

// The check of PreparedLayer::force_dispatch(): ok for "" and for a name in `layer_choices` (the
// layer's own, every token count's dispatch_candidates() together); otherwise an error naming
// `choice` and what was expected.
Status check_forced_choice(const std::string& choice,
                           const std::vector<std::string>& layer_choices);

// Stores `rows` under `key`, keeping the file's other keys.
Status save_tuned_rows(const std::string& path, const std::string& key,
                       const std::vector<TunedRow>& rows);

}  // namespace qmoe

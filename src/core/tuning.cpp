// Tune files (qmoe/tuning.h).
#include "qmoe/tuning.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace qmoe {

namespace {

using nlohmann::json;

constexpr int kTuneVersion = 1;

Status read_file(const std::string& path, json* doc, bool* exists) {
  std::ifstream in(path);
  *exists = static_cast<bool>(in);
  if (!*exists) return Status::ok();
  try {
    in >> *doc;
  } catch (const std::exception& e) {
    return Status::invalid("tune file " + path + ": not JSON (" + e.what() + ")");
  }
  if (!doc->is_object() || !doc->contains("qmoe_tune") || !(*doc)["qmoe_tune"].is_number() ||
      (*doc)["qmoe_tune"].get<int>() != kTuneVersion || !doc->contains("layers") ||
      !(*doc)["layers"].is_object()) {
    return Status::invalid("tune file " + path +
                           ": expected {\"qmoe_tune\": 1, \"layers\": {...}} at the top");
  }
  return Status::ok();
}

}  // namespace

std::string tune_key(const LayerSpec& s, const std::string& device) {
  std::ostringstream k;
  k << device << " | H " << s.hidden << " I " << s.inter << " E " << s.num_experts;
  // A shard (local experts) times differently from the whole layer: its calls touch only its L
  // experts, and the shard holding the shared experts runs them for every token. Unsharded keys
  // stay as they were, so existing tune files still apply.
  if (s.sharded()) k << " local " << s.first_expert << "+" << s.weight_experts();
  k << " slots " << s.slots() << " | " << dtype_name(s.act_dtype) << " | fc1 " << s.fc1.to_string()
    << " fc2 " << s.fc2.to_string();
  if (s.has_fc3()) k << " fc3 " << s.fc3.to_string();
  k << " | " << activation_name(s.activation.kind);
  if (s.activation.gated()) k << " glu " << static_cast<int>(s.activation.glu);
  return k.str();
}

Status load_tuned_rows(const std::string& path, const std::string& key, std::vector<TunedRow>* rows,
                       bool* found) {
  rows->clear();
  *found = false;
  json doc;
  bool exists = false;
  QMOE_RETURN_IF_ERROR(read_file(path, &doc, &exists));
  if (!exists) return Status::ok();
  const json& layers = doc["layers"];
  auto it = layers.find(key);
  if (it == layers.end()) return Status::ok();
  if (!it->is_array())
    return Status::invalid("tune file " + path + ": rows of '" + key + "' are not an array");
  int64_t prev = 0;
  for (const json& r : *it) {
    if (!r.is_object() || !r.contains("max_tokens") || !r["max_tokens"].is_number_integer() ||
        !r.contains("choice") || !r["choice"].is_string()) {
      return Status::invalid("tune file " + path +
                             ": each row must be {\"max_tokens\": N, \"choice\": \"...\"}");
    }
    TunedRow row{r["max_tokens"].get<int64_t>(), r["choice"].get<std::string>()};
    if (row.max_tokens <= prev) {
      return Status::invalid("tune file " + path + ": max_tokens must increase, got " +
                             std::to_string(row.max_tokens) + " after " + std::to_string(prev));
    }
    prev = row.max_tokens;
    rows->push_back(row);
  }
  *found = true;
  return Status::ok();
}

Status save_tuned_rows(const std::string& path, const std::string& key,
                       const std::vector<TunedRow>& rows) {
  json doc;
  bool exists = false;
  QMOE_RETURN_IF_ERROR(read_file(path, &doc, &exists));
  if (!exists) doc = json{{"qmoe_tune", kTuneVersion}, {"layers", json::object()}};
  int64_t prev = 0;
  json arr = json::array();
  for (const TunedRow& r : rows) {
    if (r.max_tokens <= prev || r.choice.empty()) {
      return Status::invalid("save_tuned_rows: max_tokens must increase and choices be named");
    }
    prev = r.max_tokens;
    arr.push_back(json{{"max_tokens", r.max_tokens}, {"choice", r.choice}});
  }
  doc["layers"][key] = arr;
  std::ofstream out(path, std::ios::trunc);
  if (!out) return Status::io_error("tune file " + path + ": cannot open for writing");
  out << doc.dump(2) << '\n';
  if (!out) return Status::io_error("tune file " + path + ": write failed");
  return Status::ok();
}

const std::vector<std::string>& dispatch_choice_names() {
  static const std::vector<std::string> names = {
      "generic", "decode/1", "fused", "generic/32", "generic/64", "generic/128", "generic/144"};
  return names;
}

// "a, b or c".
static std::string join_or(const std::vector<std::string>& v) {
  std::string list;
  for (size_t i = 0; i < v.size(); ++i) {
    list += (i == 0 ? "" : (i + 1 == v.size() ? " or " : ", ")) + v[i];
  }
  return list;
}

std::string dispatch_choice_list() { return join_or(dispatch_choice_names()); }

Status check_forced_choice(const std::string& choice,
                           const std::vector<std::string>& layer_choices) {
  if (choice.empty()) return Status::ok();
  for (const std::string& c : layer_choices) {
    if (c == choice) return Status::ok();
  }
  const std::string theirs = layer_choices.empty()
                                 ? "this backend has one path, so \"\" only"
                                 : join_or(layer_choices) + ", or \"\" for the dispatch table";
  for (const std::string& c : dispatch_choice_names()) {
    if (c == choice) {
      return Status::invalid("force_dispatch: '" + choice + "' is not a path of this layer (" +
                             theirs + ")");
    }
  }
  return Status::invalid("force_dispatch: expected " + theirs + ", got '" + choice + "'");
}

}  // namespace qmoe

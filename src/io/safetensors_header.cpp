#include "io/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "qmoe/io.h"

namespace qmoe {

namespace {

using Json = nlohmann::json;

// The length prefix and the data are little-endian; so is every host qmoe runs on.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

struct DTypeName {
  DType type;
  const char* name;
};
constexpr DTypeName kSafetensorsDTypes[] = {
    {DType::kF32, "F32"},        {DType::kF16, "F16"},        {DType::kBF16, "BF16"},
    {DType::kF64, "F64"},        {DType::kU8, "U8"},          {DType::kI8, "I8"},
    {DType::kI32, "I32"},        {DType::kF8E4M3, "F8_E4M3"}, {DType::kF8E8M0, "F8_E8M0"},
    {DType::kI64, "I64"},        {DType::kI16, "I16"},        {DType::kU16, "U16"},
    {DType::kU32, "U32"},        {DType::kU64, "U64"},        {DType::kBool, "BOOL"},
    {DType::kF8E5M2, "F8_E5M2"},
};

std::string json_type(const Json& j) { return j.type_name(); }

// Tracks the keys of every open JSON object during parsing, so a duplicate key (which nlohmann
// would silently resolve to the last value) is reported instead.
class DuplicateKeyFinder {
 public:
  bool operator()(int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        keys_.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys_.empty()) keys_.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys_.empty() && !keys_.back().insert(parsed.get<std::string>()).second &&
            duplicate_.empty()) {
          duplicate_ = parsed.get<std::string>();
          duplicate_depth_ = depth;
        }
        break;
      default:
        break;
    }
    return true;
  }
  const std::string& duplicate() const { return duplicate_; }
  int duplicate_depth() const { return duplicate_depth_; }

 private:
  std::vector<std::set<std::string>> keys_;
  std::string duplicate_;
  int duplicate_depth_ = 0;
};

class EntryParser {
 public:
  EntryParser(const std::string& path, uint64_t data_bytes)
      : path_(path), data_bytes_(data_bytes) {}

  Status parse(const std::string& name, const Json& j, SafetensorsEntry* e) const {
    e->name = name;
    if (!j.is_object()) {
      return fail(name,
                  "expected an object with dtype, shape and data_offsets, got a " + json_type(j));
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
        return fail(name,
                    "unexpected key '" + it.key() + "' (expected dtype, shape, data_offsets)");
    }
    QMOE_RETURN_IF_ERROR(parse_dtype_field(name, j, e));
    QMOE_RETURN_IF_ERROR(parse_shape(name, j, e));
    QMOE_RETURN_IF_ERROR(parse_offsets(name, j, e));
    return check_size(*e);
  }

 private:
  Status fail(const std::string& name, const std::string& what) const {
    return Status::invalid(path_ + ": tensor '" + name + "': " + what);
  }

  Status parse_dtype_field(const std::string& name, const Json& j, SafetensorsEntry* e) const {
    auto it = j.find("dtype");
    if (it == j.end()) return fail(name, "missing 'dtype'");
    if (!it->is_string()) return fail(name, "dtype: expected a string, got a " + json_type(*it));
    const std::string s = it->get<std::string>();
    if (!parse_safetensors_dtype(s, &e->dtype)) {
      return Status::unsupported(path_ + ": tensor '" + name + "': unsupported dtype '" + s +
                                 "' (supported: F32, F16, BF16, F64, U8, I8, I32, F8_E4M3, "
                                 "F8_E8M0)");
    }
    return Status::ok();
  }

  Status parse_shape(const std::string& name, const Json& j, SafetensorsEntry* e) const {
    auto it = j.find("shape");
    if (it == j.end()) return fail(name, "missing 'shape'");
    if (!it->is_array()) return fail(name, "shape: expected an array, got a " + json_type(*it));
    if (it->size() > static_cast<size_t>(kMaxRank)) {
      return fail(name, "shape " + it->dump() + " has rank " + std::to_string(it->size()) +
                            ", expected at most " + std::to_string(kMaxRank));
    }
    e->rank = static_cast<int>(it->size());
    for (int i = 0; i < e->rank; ++i) {
      const Json& d = (*it)[i];
      // Values beyond int64 parse as floats in nlohmann, so this also rejects absurd sizes.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return fail(name, "shape " + it->dump() + ": dimension " + std::to_string(i) +
                              " is not a non-negative integer");
      }
      e->dims[i] = static_cast<int64_t>(d.get<uint64_t>());
    }
    return Status::ok();
  }

  Status parse_offsets(const std::string& name, const Json& j, SafetensorsEntry* e) const {
    auto it = j.find("data_offsets");
    if (it == j.end()) return fail(name, "missing 'data_offsets'");
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
        !(*it)[1].is_number_unsigned()) {
      return fail(
          name, "data_offsets: expected [begin, end] of non-negative integers, got " + it->dump());
    }
    e->begin = (*it)[0].get<uint64_t>();
    e->end = (*it)[1].get<uint64_t>();
    if (e->begin > e->end) {
      return fail(name, "data_offsets [" + std::to_string(e->begin) + ", " +
                            std::to_string(e->end) + "): begin > end");
    }
    if (e->end > data_bytes_) {
      return fail(name, "data_offsets [" + std::to_string(e->begin) + ", " +
                            std::to_string(e->end) + ") end past the data section of " +
                            std::to_string(data_bytes_) + " bytes (truncated file?)");
    }
    return Status::ok();
  }

  Status check_size(const SafetensorsEntry& e) const {
    uint64_t bytes = dtype_size(e.dtype);
    bool overflow = false;
    for (int i = 0; i < e.rank; ++i)
      overflow |= __builtin_mul_overflow(bytes, static_cast<uint64_t>(e.dims[i]), &bytes);
    const std::string what =
        std::string(safetensors_dtype_name(e.dtype)) + " " + shape_string(e.dims, e.rank);
    if (overflow) return fail(e.name, what + " is too large");
    if (bytes != e.end - e.begin) {
      return fail(e.name, "data_offsets [" + std::to_string(e.begin) + ", " +
                              std::to_string(e.end) + ") hold " + std::to_string(e.end - e.begin) +
                              " bytes, expected " + std::to_string(bytes) + " for " + what);
    }
    return Status::ok();
  }

  const std::string& path_;
  uint64_t data_bytes_;
};

Status parse_metadata(const std::string& path, const Json& j,
                      std::map<std::string, std::string>* out) {
  if (!j.is_object()) {
    return Status::invalid(path + ": __metadata__: expected an object of strings, got a " +
                           json_type(j));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_string()) {
      return Status::invalid(path + ": __metadata__['" + it.key() +
                             "']: expected a string value, got a " + json_type(it.value()));
    }
    (*out)[it.key()] = it.value().get<std::string>();
  }
  return Status::ok();
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kSafetensorsDTypes)
    if (d.type == t) return d.name;
  return "?";
}

bool parse_safetensors_dtype(const std::string& name, DType* out) {
  for (const auto& d : kSafetensorsDTypes) {
    if (name == d.name) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

Status parse_safetensors_header(const std::string& path, const uint8_t* file, size_t file_bytes,
                                SafetensorsHeader* out) {
  *out = SafetensorsHeader();
  if (file_bytes < 8) {
    return Status::invalid(path + ": file has " + std::to_string(file_bytes) +
                           " bytes, expected at least 8 (the header length)");
  }
  uint64_t n = 0;
  std::memcpy(&n, file, 8);
  if (n > kMaxSafetensorsHeaderBytes) {
    return Status::invalid(path + ": header length " + std::to_string(n) +
                           " exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes) +
                           " bytes");
  }
  if (8 + n > file_bytes) {
    return Status::invalid(path + ": header length " + std::to_string(n) +
                           " runs past the end of a " + std::to_string(file_bytes) +
                           "-byte file (truncated file?)");
  }
  const char* text = reinterpret_cast<const char*>(file + 8);
  Json header;
  DuplicateKeyFinder dups;
  try {
    header = Json::parse(text, text + n, std::ref(dups));
  } catch (const Json::exception& e) {
    return Status::invalid(path + ": header is not valid JSON: " + e.what());
  }
  if (!dups.duplicate().empty()) {
    return Status::invalid(path + ": header has the key '" + dups.duplicate() + "' twice" +
                           (dups.duplicate_depth() == 1 ? " (duplicate tensor name)" : ""));
  }
  if (!header.is_object()) {
    return Status::invalid(path + ": header: expected a JSON object, got a " + json_type(header));
  }

  out->data_start = 8 + n;
  const uint64_t data_bytes = file_bytes - out->data_start;
  EntryParser parser(path, data_bytes);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      QMOE_RETURN_IF_ERROR(parse_metadata(path, it.value(), &out->metadata));
      continue;
    }
    SafetensorsEntry e;
    QMOE_RETURN_IF_ERROR(parser.parse(it.key(), it.value(), &e));
    out->entries.push_back(std::move(e));
  }

  auto& entries = out->entries;
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.name < b.name;
            });
  // Sorted by begin, two non-empty ranges overlap exactly when one starts before the previous
  // non-empty one ends; empty tensors occupy no bytes.
  const SafetensorsEntry* last = nullptr;
  for (const auto& e : entries) {
    if (e.begin == e.end) continue;
    if (last && e.begin < last->end) {
      return Status::invalid(path + ": tensors '" + last->name + "' [" +
                             std::to_string(last->begin) + ", " + std::to_string(last->end) +
                             ") and '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                             std::to_string(e.end) + ") overlap");
    }
    last = &e;
  }
  return Status::ok();
}

std::string encode_safetensors_header(const std::vector<std::pair<std::string, TensorView>>& tensors,
                                      const std::map<std::string, std::string>& metadata,
                                      std::vector<uint64_t>* offsets, uint64_t* data_bytes) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& kv : metadata) meta[kv.first] = kv.second;
    header["__metadata__"] = std::move(meta);
  }
  offsets->clear();
  uint64_t offset = 0;
  for (const auto& [name, view] : tensors) {
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int i = 0; i < view.rank; ++i) shape.push_back(static_cast<uint64_t>(view.dims[i]));
    const uint64_t bytes = view.bytes();
    header[name] = {{"dtype", safetensors_dtype_name(view.dtype)},
                    {"shape", std::move(shape)},
                    {"data_offsets", {offset, offset + bytes}}};
    offsets->push_back(offset);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  *data_bytes = offset;
  return text;
}

}  // namespace qmoe

// Validation of a safetensors file's bytes, separate from mapping them so that it is a pure
// function of (bytes, size) and every malformed case can be tested without touching a file system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kU8;
  int rank = 0;
  int64_t dims[kMaxRank] = {0, 0, 0, 0};
  uint64_t begin = 0, end = 0;  // [begin, end) relative to the start of the data section
};

struct SafetensorsHeader {
  uint64_t data_start = 0;                // 8 + header length
  std::vector<SafetensorsEntry> entries;  // sorted by begin (then by name)
  std::map<std::string, std::string> metadata;
};

// Validates the whole file: the length prefix, the JSON header, every tensor's dtype, shape and
// offsets against the data section, and that no two tensors overlap. Gaps between tensors are
// allowed. `path` only names the file in messages.
Status parse_safetensors_header(const std::string& path, const uint8_t* file, size_t file_bytes,
                                SafetensorsHeader* out);

// The header of a safetensors file holding `tensors` (their names, dtypes and shapes; the data
// pointers are not read) back to back in the order given: the JSON text, padded with spaces to a
// multiple of 8 bytes (the 8-byte length prefix not included), with __metadata__ when metadata is
// not empty. offsets receives each tensor's offset in the data section, *data_bytes its size.
std::string encode_safetensors_header(const std::vector<std::pair<std::string, TensorView>>& tensors,
                                      const std::map<std::string, std::string>& metadata,
                                      std::vector<uint64_t>* offsets, uint64_t* data_bytes);

}  // namespace qmoe

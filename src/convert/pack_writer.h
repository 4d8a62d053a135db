// Writes a safetensors file whose tensors are produced one at a time, without holding them all:
// every tensor's name, dtype and shape is declared first, which fixes the header and each offset;
// the data is then written at its offset in any order. The file is created under a temporary name
// and renamed into place by commit(); destroying an uncommitted writer removes it.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe::convert {

class PackWriter {
 public:
  explicit PackWriter(std::string path) : path_(std::move(path)) {}
  ~PackWriter();
  PackWriter(const PackWriter&) = delete;
  PackWriter& operator=(const PackWriter&) = delete;

  // Declares a tensor; all declarations come before begin().
  void declare(const std::string& name, DType dtype, std::initializer_list<int64_t> shape);
  // Lays the tensors out (larger elements first, so each starts at a multiple of its element
  // size, as write_safetensors() does), creates the temporary file and writes the header.
  Status begin(const std::map<std::string, std::string>& metadata);
  // Writes `bytes` bytes of a declared tensor, starting `at` bytes into it (a tensor may be written
  // in pieces, e.g. one expert at a time). Safe to call from several threads.
  Status write(const std::string& name, const void* data, size_t bytes, uint64_t at = 0);
  // Checks every tensor was written, closes and renames the file into place.
  Status commit();
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  struct Slot {
    std::string name;
    TensorView shape;  // data unused
    uint64_t offset = 0;
    uint64_t written = 0;  // bytes (pieces never overlap)
  };
  std::string path_, tmp_;
  std::vector<Slot> slots_;
  std::map<std::string, size_t> index_;
  std::mutex mu_;
  int fd_ = -1;
  uint64_t data_start_ = 0, file_bytes_ = 0;
  bool committed_ = false;
};

}  // namespace qmoe::convert

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "io/safetensors_header.h"
#include "qmoe/io.h"

namespace qmoe {

namespace {

Status check_tensor(const std::string& path, const NamedTensor& t) {
  const std::string where = path + ": tensor '" + t.name + "'";
  if (t.name.empty()) return Status::invalid(path + ": a tensor has an empty name");
  if (t.name == "__metadata__") return Status::invalid(where + ": the name is reserved");
  if (!t.view.given()) return Status::invalid(where + ": no data (absent view)");
  if (t.view.rank < 0 || t.view.rank > kMaxRank) {
    return Status::invalid(where + ": rank " + std::to_string(t.view.rank) + ", expected 0.." +
                           std::to_string(kMaxRank));
  }
  for (int i = 0; i < t.view.rank; ++i) {
    if (t.view.dims[i] < 0) {
      return Status::invalid(where + ": negative dimension in shape " + t.view.shape_string());
    }
  }
  if (std::string(safetensors_dtype_name(t.view.dtype)) == "?") {
    return Status::unsupported(where + ": dtype has no safetensors name");
  }
  return Status::ok();
}

class File {
 public:
  explicit File(const std::string& path) : f_(std::fopen(path.c_str(), "wb")) {}
  ~File() {
    if (f_) std::fclose(f_);
  }
  bool is_open() const { return f_ != nullptr; }
  bool write(const void* p, size_t n) { return n == 0 || std::fwrite(p, 1, n, f_) == n; }
  bool close() {
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    return ok;
  }

 private:
  std::FILE* f_;
};

}  // namespace

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    QMOE_RETURN_IF_ERROR(check_tensor(path, t));
    if (!names.insert(t.name).second) {
      return Status::invalid(path + ": tensor '" + t.name + "' given twice");
    }
  }

  // Larger elements first: with the data section starting at a multiple of 8, every tensor then
  // starts at a multiple of its own element size.
  std::vector<const NamedTensor*> order;
  for (const NamedTensor& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    return dtype_size(a->view.dtype) > dtype_size(b->view.dtype);
  });

  std::vector<std::pair<std::string, TensorView>> entries;
  for (const NamedTensor* t : order) entries.emplace_back(t->name, t->view);
  std::vector<uint64_t> offsets;
  uint64_t data_bytes = 0;
  const std::string text = encode_safetensors_header(entries, metadata, &offsets, &data_bytes);
  const uint64_t n = text.size();

  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  File f(tmp);
  if (!f.is_open()) return Status::io_error(path + ": cannot create: " + std::strerror(errno));
  bool ok = f.write(&n, 8) && f.write(text.data(), text.size());
  for (const NamedTensor* t : order) ok = ok && f.write(t->view.data, t->view.bytes());
  ok = f.close() && ok;
  if (!ok) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::io_error(path + ": write failed: " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::io_error(path + ": cannot rename the written file into place: " + why);
  }
  return Status::ok();
}

}  // namespace qmoe

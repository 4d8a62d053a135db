#include "convert/pack_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "io/safetensors_header.h"
#include "qmoe/io.h"

namespace qmoe::convert {

namespace {

Status pwrite_all(int fd, const void* data, size_t bytes, uint64_t offset,
                  const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::io_error(path + ": write failed: " + std::strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

}  // namespace

PackWriter::~PackWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void PackWriter::declare(const std::string& name, DType dtype,
                         std::initializer_list<int64_t> shape) {
  index_[name] = slots_.size();
  slots_.push_back({name, TensorView(nullptr, dtype, shape), 0, 0});
}

Status PackWriter::begin(const std::map<std::string, std::string>& metadata) {
  std::stable_sort(slots_.begin(), slots_.end(), [](const Slot& a, const Slot& b) {
    return dtype_size(a.shape.dtype) > dtype_size(b.shape.dtype);
  });
  std::vector<std::pair<std::string, TensorView>> entries;
  for (const Slot& s : slots_) entries.emplace_back(s.name, s.shape);
  std::vector<uint64_t> offsets;
  uint64_t offset = 0;
  const std::string text = encode_safetensors_header(entries, metadata, &offsets, &offset);
  for (size_t i = 0; i < slots_.size(); ++i) {
    index_[slots_[i].name] = i;
    slots_[i].offset = offsets[i];
  }
  const uint64_t n = text.size();
  data_start_ = 8 + n;
  file_bytes_ = data_start_ + offset;

  tmp_ = path_ + ".tmp" + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const std::string why = std::strerror(errno);
    tmp_.clear();
    return Status::io_error(path_ + ": cannot create: " + why);
  }
  if (::ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0) {
    return Status::io_error(path_ + ": cannot size the file to " + std::to_string(file_bytes_) +
                            " bytes: " + std::strerror(errno));
  }
  QMOE_RETURN_IF_ERROR(pwrite_all(fd_, &n, 8, 0, path_));
  return pwrite_all(fd_, text.data(), text.size(), 8, path_);
}

Status PackWriter::write(const std::string& name, const void* data, size_t bytes, uint64_t at) {
  auto it = index_.find(name);
  if (it == index_.end() || fd_ < 0) {
    return Status::internal(path_ + ": tensor '" + name + "' was not declared");
  }
  Slot& s = slots_[it->second];
  if (at + bytes > s.shape.bytes()) {
    return Status::internal(path_ + ": tensor '" + name + "': bytes [" + std::to_string(at) + ", " +
                            std::to_string(at + bytes) + ") past its " +
                            std::to_string(s.shape.bytes()));
  }
  QMOE_RETURN_IF_ERROR(pwrite_all(fd_, data, bytes, data_start_ + s.offset + at, path_));
  std::lock_guard<std::mutex> lock(mu_);
  s.written += bytes;
  return Status::ok();
}

Status PackWriter::commit() {
  for (const Slot& s : slots_) {
    if (s.written != s.shape.bytes())
      return Status::internal(path_ + ": tensor '" + s.name + "' was not written");
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return Status::io_error(path_ + ": close failed: " + std::strerror(errno));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return Status::io_error(path_ +
                            ": cannot rename the written file into place: " + std::strerror(errno));
  }
  committed_ = true;
  return Status::ok();
}

}  // namespace qmoe::convert

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "io/safetensors_header.h"
#include "qmoe/io.h"

namespace qmoe {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Closes the descriptor on every path out of open(); the mapping outlives it.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

TensorView make_view(const void* data, const SafetensorsEntry& e) {
  TensorView v;
  v.data = data;
  v.dtype = e.dtype;
  v.rank = e.rank;
  for (int i = 0; i < e.rank; ++i) v.dims[i] = e.dims[i];
  return v;
}

}  // namespace

Status SafetensorsFile::open(const std::string& path, std::unique_ptr<SafetensorsFile>* out) {
  out->reset();
  FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) return Status::io_error(path + ": cannot open: " + errno_text());
  struct stat st;
  if (::fstat(fd.fd, &st) != 0) return Status::io_error(path + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) return Status::io_error(path + ": not a regular file");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    return Status::invalid(path + ": file has " + std::to_string(size) +
                           " bytes, expected at least 8 (the header length)");
  }

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (map == MAP_FAILED) return Status::io_error(path + ": cannot map: " + errno_text());
  file->map_ = static_cast<const uint8_t*>(map);
  file->map_bytes_ = size;

  SafetensorsHeader header;
  QMOE_RETURN_IF_ERROR(parse_safetensors_header(path, file->map_, size, &header));
  file->metadata_ = std::move(header.metadata);
  for (const SafetensorsEntry& e : header.entries) {
    const uint8_t* data = file->map_ + header.data_start + e.begin;
    const size_t bytes = static_cast<size_t>(e.end - e.begin);
    if (reinterpret_cast<uintptr_t>(data) % dtype_size(e.dtype) != 0) {
      // operator new[] returns memory aligned for any scalar type.
      file->aligned_copies_.emplace_back(new uint8_t[bytes > 0 ? bytes : 1]);
      std::memcpy(file->aligned_copies_.back().get(), data, bytes);
      data = file->aligned_copies_.back().get();
    }
    file->names_.push_back(e.name);
    file->tensors_[e.name] = make_view(data, e);
  }
  *out = std::move(file);
  return Status::ok();
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsFile::get(const std::string& name, TensorView* out) const {
  const TensorView* v = find(name);
  if (!v) return Status::invalid(path_ + ": missing tensor '" + name + "'");
  *out = *v;
  return Status::ok();
}

void SafetensorsFile::release(const TensorView& view) const {
  const auto* p = static_cast<const uint8_t*>(view.data);
  if (!p || p < map_ || p + view.bytes() > map_ + map_bytes_ || view.bytes() == 0) return;
  // Whole pages, rounded outward: the mapping is private and never written, so dropping a page a
  // neighbouring tensor shares only means it is read from the file again.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p + view.bytes()) + page - 1) & ~(page - 1);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace qmoe

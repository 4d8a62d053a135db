#include "record.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>

#ifdef QMOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

extern char** environ;

namespace qmoe::cli {

namespace {

#ifdef QMOE_WITH_CUDA
// 13000 -> "13.0".
std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
#endif

std::string folder_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

std::string version_line() {
  return std::string("qmoe ") + QMOE_VERSION + " (commit " + build_commit() + ")";
}

RunRecord make_record(const std::string& device) {
  RunRecord r;
  r.version = QMOE_VERSION;
  r.commit = build_commit();
  r.device = device;
#ifdef QMOE_WITH_CUDA
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0) r.driver = cuda_version_text(v);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess && v > 0) r.runtime = cuda_version_text(v);
  cudaGetLastError();  // only for the report
#endif
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (kv.rfind("QMOE_", 0) == 0 && eq != std::string::npos) {
      r.settings.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    }
  }
  std::sort(r.settings.begin(), r.settings.end());
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  r.time_utc = buf;
  return r;
}

std::string settings_text(const RunRecord& r) {
  if (r.settings.empty()) return "defaults";
  std::string s;
  for (const auto& [k, v] : r.settings) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s;
}

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

StepNote::StepNote(std::string what) : what_(std::move(what)), start_(now_seconds()) {
  shown_ = isatty(STDERR_FILENO) != 0;
  if (shown_) std::fprintf(stderr, "qmoe: %s...\n", what_.c_str());
}

StepNote::~StepNote() {
  if (shown_) std::fprintf(stderr, "qmoe: %s: %.1f s\n", what_.c_str(), now_seconds() - start_);
}

bool warn_if_short_of_memory(double bytes, const std::string& what) {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (f >> key >> kb) {
    if (key == "MemAvailable:") break;
    f.ignore(256, '\n');
    kb = 0;
  }
  if (kb <= 0 || bytes <= kb * 1024.0) return false;
  std::fprintf(stderr,
               "qmoe: warning: %s needs about %.1f GB of host memory; %.1f GB are available. "
               "Expect swapping or the process being killed.\n",
               what.c_str(), bytes / 1e9, kb * 1024.0 / 1e9);
  return true;
}

Status check_output_path(const std::string& flag, const std::string& path) {
  if (path.empty()) return Status::invalid(flag + ": expected a file path, got an empty one");
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::invalid(flag + ": " + path + " is a directory; expected a file path");
  }
  const std::string dir = folder_of(path);
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::io_error(flag + ": cannot write " + path + ": folder " + dir +
                            " does not exist");
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return Status::io_error(flag + ": cannot write " + path + ": folder " + dir +
                            " is not writable");
  }
  return Status::ok();
}

Status write_file_atomically(const std::string& flag, const std::string& path,
                             const std::string& text) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return Status::io_error(flag + ": cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::io_error(flag + ": cannot rename " + tmp + " to " + path + ": " + why);
  }
  return Status::ok();
}

}  // namespace qmoe::cli

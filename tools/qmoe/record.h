// What every `qmoe bench` row and `qmoe --version` say about the build and the machine they ran
// on (commit, device, driver, CUDA runtime, the QMOE_* settings in effect, the time), so that a
// recorded row describes itself; and the checks every command makes on its output paths before
// any work starts.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "qmoe/status.h"

namespace qmoe::cli {

// The commit this binary was built from (`git describe --always --dirty`, or "unknown"); written
// at build time (cmake/qmoe_version.cmake).
const char* build_commit();

// "qmoe 0.1.0 (commit 223e292abc)".
std::string version_line();

struct RunRecord {
  std::string version;  // QMOE_VERSION
  std::string commit;   // build_commit()
  std::string device;   // "NVIDIA H200" or "host (16 threads)"
  std::string driver;   // the CUDA driver's version ("13.0"), "" without CUDA
  std::string runtime;  // the CUDA runtime's version, "" without CUDA
  // Every QMOE_* environment variable set for this process, sorted: the settings the layers read.
  std::vector<std::pair<std::string, std::string>> settings;
  std::string time_utc;  // when the command started, ISO 8601
};

// The record for this process; device as the caller names it.
RunRecord make_record(const std::string& device);
// "QMOE_DISPATCH=decode/1 QMOE_PDL=0", or "defaults" when none is set.
std::string settings_text(const RunRecord& r);

// An output file's path is usable: not empty, not a directory, its folder exists and is
// writable. flag names the option in the message (e.g. "--csv").
Status check_output_path(const std::string& flag, const std::string& path);

// Progress of one step that can take seconds (synthesis, prepare, the oracle): on a terminal,
// "qmoe: <what>..." on stderr when it starts and the seconds it took when it ends; nothing when
// stderr is not a terminal, so piped and recorded output stays as it was.
class StepNote {
 public:
  explicit StepNote(std::string what);
  ~StepNote();
  StepNote(const StepNote&) = delete;
  StepNote& operator=(const StepNote&) = delete;

 private:
  std::string what_;
  double start_ = 0;
  bool shown_ = false;
};

// Warns on stderr when a step needs more host memory than the machine has available
// (MemAvailable of /proc/meminfo): `bytes` for `what`. Returns whether it warned.
bool warn_if_short_of_memory(double bytes, const std::string& what);

// Writes text to path through a temporary file in the same folder and a rename, so a reader
// never sees half a file and a failed write leaves any old file as it was.
Status write_file_atomically(const std::string& flag, const std::string& path,
                             const std::string& text);

}  // namespace qmoe::cli

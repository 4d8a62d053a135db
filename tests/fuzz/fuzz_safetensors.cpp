// libFuzzer target: the safetensors header parser on arbitrary bytes (a whole file's contents).
// Whatever the bytes, it must return a Status (never crash, hang or read outside the buffer), and
// a header it accepts must describe tensors that lie inside the file, do not overlap and have
// exactly the bytes their dtype and shape imply: the guarantees SafetensorsFile's views rely on.
// An empty tensor occupies no bytes, so it may sit anywhere inside the data, even inside another
// tensor's range; only non-empty ranges are checked for overlap.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/safetensors_header.h"
#include "qmoe/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  qmoe::SafetensorsHeader h;
  if (!qmoe::parse_safetensors_header("fuzz.safetensors", data, size, &h).is_ok()) return 0;
  const uint64_t data_bytes = size - h.data_start;
  if (h.data_start > size) std::abort();
  uint64_t prev_end = 0;
  for (const qmoe::SafetensorsEntry& e : h.entries) {
    if (e.begin > e.end || e.end > data_bytes) std::abort();
    uint64_t count = 1;
    for (int d = 0; d < e.rank; ++d) count *= static_cast<uint64_t>(e.dims[d]);
    if (count * qmoe::dtype_size(e.dtype) != e.end - e.begin) std::abort();
    if (e.begin == e.end) continue;
    if (e.begin < prev_end) std::abort();
    prev_end = e.end;
  }
  return 0;
}

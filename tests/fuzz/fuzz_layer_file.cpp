// libFuzzer target: a whole layer file (safetensors header, ORT attributes and qmoe.* keys in the
// metadata, the ORT tensors and their shapes, layer_from_ort, check_layer), then, for a layer the
// reader accepts, one CPU call of one token on it. Every input must give a Status or a finite
// run: never a crash, a hang or an out-of-bounds read. The bytes go through a file because the
// reader maps files.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "qmoe/backend.h"
#include "qmoe/io.h"

namespace {

std::string scratch_path() {
  static const std::string path =
      std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/qmoe-fuzz-" +
      std::to_string(getpid()) + ".safetensors";
  return path;
}

// A buffer of n values of 0.5 in dtype t (f32, f16 or bf16).
std::vector<uint8_t> halves(qmoe::DType t, int64_t n) {
  const size_t es = qmoe::dtype_size(t);
  const uint32_t bits = t == qmoe::DType::kF32 ? 0x3F000000u : t == qmoe::DType::kF16 ? 0x3800u : 0x3F00u;
  std::vector<uint8_t> b(static_cast<size_t>(n) * es);
  for (size_t i = 0; i < b.size(); i += es) std::memcpy(&b[i], &bits, es);
  return b;
}

// One token through the CPU backend: small layers only (every byte of their tensors is in the
// fuzz input, so they are small anyway; this bounds the time of a pathological shape).
void run_one_token(const qmoe::LoadedLayer& l) {
  const qmoe::LayerSpec& spec = l.spec;
  if (spec.hidden * spec.inter * spec.num_experts > (int64_t{1} << 20)) return;
  qmoe::PrepareOptions opt;
  opt.num_threads = 1;
  std::unique_ptr<qmoe::PreparedLayer> layer;
  if (!qmoe::prepare_layer(qmoe::BackendKind::kCpu, spec, l.weights, opt, &layer).is_ok()) return;
  const qmoe::DType t = spec.act_dtype;
  std::vector<uint8_t> x = halves(t, spec.hidden), logits = halves(t, spec.num_experts);
  std::vector<uint8_t> y(x.size());
  qmoe::RunInputs in;
  in.input = qmoe::TensorView(x.data(), t, {1, spec.hidden});
  in.router_logits = qmoe::TensorView(logits.data(), t, {1, spec.num_experts});
  qmoe::MutableTensorView out(y.data(), t, {1, spec.hidden});
  const size_t bytes = layer->workspace_size(1);
  std::vector<uint8_t> ws(bytes + 256);
  void* aligned = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;
  (void)layer->run(in, out, aligned, bytes, nullptr);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = scratch_path();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return 0;
    if (size > 0) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  qmoe::LoadedLayer l;
  if (qmoe::load_layer_file(path, &l).is_ok()) run_one_token(l);
  return 0;
}

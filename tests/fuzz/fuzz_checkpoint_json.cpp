// libFuzzer target: the two JSON files a checkpoint directory brings, config.json and
// model.safetensors.index.json. The first byte picks which parser reads the rest. A config the
// parser accepts must give a layer spec check_spec() accepts for the default INT4 format (or an
// error), and an index must name only plain shard file names: never a crash, an unbounded
// allocation or a path outside the checkpoint.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "convert/checkpoint.h"
#include "qmoe/convert.h"
#include "qmoe/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    std::map<std::string, std::string> shard_of;
    if (!qmoe::convert::parse_index(text, "index.json", &shard_of).is_ok()) return 0;
    for (const auto& [tensor, shard] : shard_of) {
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
        std::abort();
      }
    }
    return 0;
  }
  qmoe::MoeModelConfig config;
  if (!qmoe::parse_model_config(text, "config.json", &config).is_ok()) return 0;
  const qmoe::FcFormat f = qmoe::default_fc_format(qmoe::WeightFormat::kInt4);
  const qmoe::LayerSpec spec = qmoe::moe_layer_spec(config, f, f);
  (void)qmoe::check_spec(spec);
  return 0;
}

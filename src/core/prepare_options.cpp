// PrepareOptions from the caller and the environment (resolve_prepare_options, qmoe/backend.h):
// the only place a QMOE_* setting is read. Each variable applies where its field holds the
// default, then every field is checked, so a bad value fails prepare, naming where it came from.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "qmoe/backend.h"
#include "qmoe/tuning.h"

namespace qmoe {

namespace {

// The variable's value, or nullptr where it is unset or empty.
const char* env_value(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// The tiles mixed_tile may name, as text: the N of every "generic/N" dispatch choice
// (qmoe/tuning.h), the list the CUDA backend checks its own tiles against (dispatch.h's
// kMixedTiles), so the two cannot drift apart.
std::vector<std::string> mixed_tile_names() {
  const std::string prefix = "generic/";
  std::vector<std::string> tiles;
  for (const std::string& c : dispatch_choice_names()) {
    if (c.compare(0, prefix.size(), prefix) == 0) tiles.push_back(c.substr(prefix.size()));
  }
  return tiles;
}

// One integer setting: where it may come from, its range, and what the range means in words.
struct IntSetting {
  const char* env;
  const char* field;
  int lo, hi;
  const char* expected;  // for the error: "0 (automatic), 1, 2 or a multiple of 4"
  bool multiple_of_4_above_2 = false;
};

bool in_range(const IntSetting& s, long v) {
  if (v < s.lo || v > s.hi) return false;
  return !s.multiple_of_4_above_2 || v <= 2 || v % 4 == 0;
}

// The variable applies where *field holds its default; its text must be a whole integer in range.
Status apply_int(const IntSetting& s, int default_value, int* field) {
  const char* v = env_value(s.env);
  if (v != nullptr && *field == default_value) {
    // The whole text, digits with an optional minus (strtol alone would skip leading blanks).
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    const bool number = std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '-';
    if (!number || end == v || *end != '\0' || errno == ERANGE || !in_range(s, n)) {
      return Status::invalid(std::string(s.env) + ": expected " + s.expected + ", got '" + v + "'");
    }
    *field = static_cast<int>(n);
    return Status::ok();
  }
  if (!in_range(s, *field)) {
    return Status::invalid(std::string(s.field) + ": expected " + s.expected + ", got " +
                           std::to_string(*field));
  }
  return Status::ok();
}

// A string setting: the variable applies where the field is empty; `allowed` checks the result.
Status apply_string(const char* env, const char* field, const std::vector<std::string>& allowed,
                    const std::string& expected, std::string* value) {
  const char* from = field;
  if (value->empty()) {
    const char* v = env_value(env);
    if (v == nullptr) return Status::ok();
    *value = v;
    from = env;
  }
  if (allowed.empty()) return Status::ok();
  for (const std::string& a : allowed) {
    if (*value == a) return Status::ok();
  }
  return Status::invalid(std::string(from) + ": expected " + expected + ", got '" + *value + "'");
}

}  // namespace

Status resolve_prepare_options(const PrepareOptions& options, PrepareOptions* out) {
  if (out == nullptr) return Status::invalid("out: expected a non-null pointer");
  PrepareOptions o = options;
  QMOE_RETURN_IF_ERROR(apply_string("QMOE_TUNE_FILE", "tune_file", {}, "", &o.tune_file));
  QMOE_RETURN_IF_ERROR(apply_string("QMOE_GEMM", "gemm", {"cutlass", "cutlass-dequant", "mma"},
                                    "cutlass, cutlass-dequant or mma", &o.gemm));
  // QMOE_CUDA_PATH=generic is QMOE_DISPATCH=generic's older spelling; other values meant nothing.
  if (o.dispatch.empty() && env_value("QMOE_DISPATCH") == nullptr) {
    const char* old = env_value("QMOE_CUDA_PATH");
    if (old != nullptr && std::string(old) == "generic") o.dispatch = "generic";
  }
  QMOE_RETURN_IF_ERROR(apply_string("QMOE_DISPATCH", "dispatch", dispatch_choice_names(),
                                    dispatch_choice_list(), &o.dispatch));
  QMOE_RETURN_IF_ERROR(apply_string("QMOE_ACT_QUANT", "act_quant", {"none", "fp8_e4m3"},
                                    "none or fp8_e4m3", &o.act_quant));
  if (o.act_quant.empty()) o.act_quant = "none";
  int pdl = o.pdl ? 1 : 0;
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_PDL", "pdl", 0, 1, "0 or 1"}, 1, &pdl));
  o.pdl = pdl != 0;
  int epilogue_act = o.epilogue_act ? 1 : 0;
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_EPILOGUE_ACT", "epilogue_act", 0, 1, "0 or 1"}, 1,
                                 &epilogue_act));
  o.epilogue_act = epilogue_act != 0;

  const DecodeOptions def;
  DecodeOptions& d = o.decode;
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_DECODE_ROWS", "decode.rows", -1, INT_MAX,
                                  "-1 (automatic), 0 (every token) or a positive row count"},
                                 def.rows, &d.rows));
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_DECODE_TPB", "decode.tiles_per_block", 0, INT_MAX,
                                  "0 (automatic), 1, 2 or a positive multiple of 4", true},
                                 def.tiles_per_block, &d.tiles_per_block));
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_DECODE_RING", "decode.ring", 0, 2,
                                  "0 (automatic), 1 (registers) or 2 (shared memory)"},
                                 def.ring, &d.ring));
  QMOE_RETURN_IF_ERROR(apply_int(
      {"QMOE_DECODE_PREFETCH", "decode.prefetch", -1, 16, "-1 (automatic) or 0..16 rounds"},
      def.prefetch, &d.prefetch));
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_DECODE_MIN_BLOCKS", "decode.min_blocks", 0, 32,
                                  "0 (none) or 1..32 blocks per multiprocessor"},
                                 def.min_blocks, &d.min_blocks));
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_DECODE_COMBINE", "decode.combine", -1, 64,
                                  "-1 (automatic), 0 (never) or 1..64 tokens"},
                                 def.combine, &d.combine));
  QMOE_RETURN_IF_ERROR(apply_int({"QMOE_FUSED_GRID", "fused_grid_ctas", 0, INT_MAX,
                                  "0 (as many as the device holds) or a CTA count"},
                                 0, &o.fused_grid_ctas));
  // A few values, not a range: the variable's text must be one of them.
  const std::vector<std::string> tiles = mixed_tile_names();
  const auto named = [&tiles](const std::string& v) {
    return v == "0" || std::find(tiles.begin(), tiles.end(), v) != tiles.end();
  };
  std::string expected = "0 (automatic)";
  for (size_t i = 0; i < tiles.size(); ++i) {
    expected += (i + 1 == tiles.size() ? " or " : ", ") + tiles[i];
  }
  const bool tile_from_env = o.mixed_tile == 0 && env_value("QMOE_MIXED_TILE") != nullptr;
  if (tile_from_env) {
    const std::string v = env_value("QMOE_MIXED_TILE");
    if (!named(v)) {
      return Status::invalid("QMOE_MIXED_TILE: expected " + expected + ", got '" + v + "'");
    }
    o.mixed_tile = std::stoi(v);
  } else if (!named(std::to_string(o.mixed_tile))) {
    return Status::invalid("mixed_tile: expected " + expected + ", got " +
                           std::to_string(o.mixed_tile));
  }
  *out = o;
  return Status::ok();
}

Status PreparedLayer::force_dispatch(const std::string& choice) {
  return check_forced_choice(choice, {});
}

}  // namespace qmoe

#include "format_flags.h"

#include "qmoe/format.h"

namespace qmoe::cli {

namespace {

std::string format_names() {
  std::string s;
  for (int i = 0; i < kNumWeightFormats; ++i) {
    s += (i ? ", " : "") + std::string(format_info(static_cast<WeightFormat>(i)).name);
  }
  return s;
}

Status parse_format(const std::string& name, const char* flag, WeightFormat* out) {
  if (!parse_weight_format(name, out)) {
    return Status::invalid(std::string(flag) + ": unknown format '" + name +
                           "' (known: " + format_names() + ")");
  }
  return Status::ok();
}

bool given(const CLI::Option* o) { return o && o->count() > 0; }

}  // namespace

bool FormatFlags::any_given() const {
  return given(format_opt) || given(block_opt) || given(scale_opt) || given(fc2_format_opt) ||
         given(fc2_block_opt) || given(zp_opt);
}

void add_format_flags(CLI::App* cmd, FormatFlags* f) {
  f->format_opt = cmd->add_option("--format", f->format,
                                  "weight format of both FCs (int2, int3, int4, int8, nvfp4, "
                                  "mxfp4, fp8, fp8_block); default: the preset's");
  f->block_opt = cmd->add_option("--block", f->block,
                                 "block size (integer formats: 0 = per channel, or a power of two "
                                 "in [16, 256] dividing K; fp8_block: square block side)");
  f->zp_opt = cmd->add_flag("--zero-points", f->zero_points,
                            "asymmetric integer quantization with explicit zero points");
  f->scale_opt = cmd->add_option("--scale-dtype", f->scale_dtype,
                                 "scale dtype of integer and fp8_block formats: f32, f16 or bf16");
  f->fc2_format_opt = cmd->add_option(
      "--fc2-format", f->fc2_format, "a different weight format for FC2 (e.g. int8 FC1, int4 FC2)");
  f->fc2_block_opt = cmd->add_option("--fc2-block", f->fc2_block, "a different block size for FC2");
}

Status apply_format_flags(const FormatFlags& f, const std::string& preset, LayerSpec* spec) {
  FcFormat fc1 = spec->fc1;
  if (given(f.format_opt)) {
    WeightFormat w;
    QMOE_RETURN_IF_ERROR(parse_format(f.format, "--format", &w));
    fc1 = default_fc_format(w);
  }
  if (given(f.block_opt)) fc1.block_size = f.block;
  if (f.zero_points) fc1.zero_points = true;
  if (given(f.scale_opt)) {
    DType t;
    if (!parse_dtype(f.scale_dtype, &t)) {
      return Status::invalid("--scale-dtype: unknown dtype '" + f.scale_dtype + "'");
    }
    fc1.scale_dtype = t;
  }

  // FC2 follows FC1 unless told otherwise, so one --format changes the whole layer.
  FcFormat fc2 = f.any_given() ? fc1 : spec->fc2;
  if (given(f.fc2_format_opt)) {
    WeightFormat w;
    QMOE_RETURN_IF_ERROR(parse_format(f.fc2_format, "--fc2-format", &w));
    fc2 = default_fc_format(w);
    if (f.zero_points) fc2.zero_points = true;
    if (given(f.scale_opt)) fc2.scale_dtype = fc1.scale_dtype;
  }
  if (given(f.fc2_block_opt)) fc2.block_size = f.fc2_block;

  const std::string where = "preset " + preset + ": ";
  Status s = check_fc_format(fc1, spec->fc1_rows(), spec->hidden, "fc1");
  if (!s.is_ok()) return Status(s.code(), where + s.message());
  s = check_fc_format(fc2, spec->hidden, spec->inter, "fc2");
  if (!s.is_ok()) return Status(s.code(), where + s.message());
  if (spec->has_fc3()) {
    s = check_fc_format(fc1, spec->inter, spec->hidden, "fc3");
    if (!s.is_ok()) return Status(s.code(), where + s.message());
  }
  spec->fc1 = fc1;
  spec->fc2 = fc2;
  spec->fc3 = fc1;
  return Status::ok();
}

}  // namespace qmoe::cli

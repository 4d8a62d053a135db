// The weight-format options shared by `qmoe run` and `qmoe make-layer`, applied on top of a
// preset's default formats.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "qmoe/layer.h"
#include "qmoe/status.h"

namespace qmoe::cli {

struct FormatFlags {
  std::string format, scale_dtype, fc2_format;
  int block = 0, fc2_block = 0;
  bool zero_points = false;
  CLI::Option *format_opt = nullptr, *block_opt = nullptr, *scale_opt = nullptr,
              *fc2_format_opt = nullptr, *fc2_block_opt = nullptr, *zp_opt = nullptr;

  bool any_given() const;
};

void add_format_flags(CLI::App* cmd, FormatFlags* f);

// Applies the flags to spec's FC formats (FC3 follows FC1) and checks them against the shape; the
// message names the flag and the preset when a choice does not fit.
Status apply_format_flags(const FormatFlags& f, const std::string& preset, LayerSpec* spec);

}  // namespace qmoe::cli

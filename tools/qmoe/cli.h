// The qmoe command-line tool: shared pieces of its subcommands (exit codes, error printing, option
// parsing helpers) and the functions that register each subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "qmoe/backend.h"
#include "qmoe/status.h"
#include "qmoe/tensor.h"

namespace qmoe::cli {

// Exit codes (every command; `qmoe --help` lists them): 0 success, 1 a failed accuracy check,
// 2 bad usage or input (an option, a shape, a file's content), 3 an I/O error (a file that cannot
// be read or written), 4 a valid request this build or machine cannot run (no GPU, a format a
// backend lacks), 5 an internal error (a bug: please report). Messages go to stderr.
constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitIo = 3;
constexpr int kExitUnsupported = 4;
constexpr int kExitInternal = 5;
// The text of the list above, for the help footers.
extern const char* const kExitCodesHelp;

// Prints "qmoe: error: <message>" to stderr and returns kExitUsage.
int usage_error(const std::string& message);
// The same for a Status (its code name and message); returns the exit code of its StatusCode.
int status_error(const Status& s);

// Parses f32 | f16 | bf16 (activation dtypes); `flag` names the option in the message.
Status parse_act_dtype(const std::string& s, const char* flag, DType* out);
// Parses auto | cpu | cuda; auto picks CUDA when backend_available() says so.
Status parse_backend(const std::string& s, BackendKind* out);

// Each registers one subcommand whose callback stores its exit code in *exit_code.
void add_run_command(CLI::App& app, int* exit_code);
void add_make_layer_command(CLI::App& app, int* exit_code);
void add_info_command(CLI::App& app, int* exit_code);
void add_bench_command(CLI::App& app, int* exit_code);
void add_convert_command(CLI::App& app, int* exit_code);

}  // namespace qmoe::cli

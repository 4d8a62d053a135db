// qmoe: run, time and check quantized MoE layers; write layer files; describe the build.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli.h"
#include "record.h"

int main(int argc, char** argv) {
  CLI::App app("qmoe: quantized Mixture-of-Experts layers with ONNX Runtime QMoE semantics",
               "qmoe");
  app.set_version_flag("--version", qmoe::cli::version_line());
  app.require_subcommand(1);
  app.footer(std::string("Examples:\n"
                         "  qmoe run                      one Qwen3-30B-A3B INT4 layer, 16 tokens, "
                         "checked\n"
                         "  qmoe bench --tokens 1,8,64    time it over token counts\n"
                         "  qmoe info                     formats, backends, GPU, presets\n"
                         "  qmoe convert --from bf16 DIR -o P  a Hugging Face checkpoint to a pack\n"
                         "  qmoe COMMAND --help           a command's options and examples\n") +
             qmoe::cli::kExitCodesHelp);
  int exit_code = qmoe::cli::kExitOk;
  qmoe::cli::add_run_command(app, &exit_code);
  qmoe::cli::add_make_layer_command(app, &exit_code);
  qmoe::cli::add_info_command(app, &exit_code);
  qmoe::cli::add_bench_command(app, &exit_code);
  qmoe::cli::add_convert_command(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "qmoe: error: %s\nRun with --help for usage.\n", e.what());
    return qmoe::cli::kExitUsage;
  }
  return exit_code;
}

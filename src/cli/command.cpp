#include "headwise/cli/command.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace headwise::cli {

std::vector<CommandEntry>& registered_commands() {
  static std::vector<CommandEntry> commands;
  return commands;
}

void add_common_flags(CLI::App* app, CommonFlags& flags, bool with_json) {
  auto* quiet = app->add_flag("-q,--quiet", flags.quiet, "Only errors on stderr");
  app->add_flag("-v,--verbose", flags.verbose, "Debug logging")->excludes(quiet);
  if (with_json) app->add_flag("--json", flags.json, "Print machine-readable JSON on stdout");
}

void apply_logging(const CommonFlags& flags) {
  auto logger = spdlog::stderr_color_mt("headwise");
  logger->set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(flags.quiet ? spdlog::level::err : flags.verbose ? spdlog::level::debug : spdlog::level::info);
}

}  // namespace headwise::cli

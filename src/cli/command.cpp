#include "headwise/cli/command.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "headwise/core/error.hpp"

namespace headwise::cli {

namespace {

// Library fields whose flag is not the option convention (--snake-to-kebab of the field id).
constexpr std::pair<std::string_view, std::string_view> kFlagOfField[] = {
    {"threads_per_worker", "--threads-per-job"},
};

}  // namespace

std::string flag_for(std::string_view field) {
  for (const auto& [id, flag] : kFlagOfField) {
    if (id == field) return std::string(flag);
  }
  return option_spelling(field);
}

std::string user_message(const std::exception& error) {
  if (const auto* named = dynamic_cast<const FieldMessage*>(&error)) return named->render(flag_for);
  return error.what();
}

std::vector<CommandEntry>& registered_commands() {
  static std::vector<CommandEntry> commands;
  return commands;
}

void add_common_flags(CLI::App* app, CommonFlags& flags, bool with_json) {
  auto* quiet = app->add_flag("-q,--quiet", flags.quiet, "Only errors on stderr");
  app->add_flag("-v,--verbose", flags.verbose, "Debug logging")->excludes(quiet);
  if (with_json) app->add_flag("--json", flags.json, "Print machine-readable JSON on stdout");
}

CLI::Option* add_runtime_attention_option(CLI::App* app, std::string& name) {
  return app
      ->add_option(
          "--runtime-attention", name,
          "Attention of the runtime decoder (and of eval's duo gate training): fused (ATen's "
          "flash/memory-efficient kernel where it applies) or explicit (the plain forward's "
          "matmul/softmax numerics; slower, for comparisons)")
      ->capture_default_str();
}

arch::AttentionKernel runtime_attention_kernel(const std::string& name) {
  if (name == "fused") return arch::AttentionKernel::kFused;
  if (name == "explicit") return arch::AttentionKernel::kExplicit;
  throw_input_error("--runtime-attention: '{}' is not one of fused, explicit", name);
}

void require_output_folder(const std::string& path, std::string_view label) {
  const std::filesystem::path file(path);
  const std::filesystem::path folder =
      file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(folder))
    throw_input_error("{}: output folder {} does not exist", label, folder.string());
}

void apply_logging(const CommonFlags& flags) {
  auto logger = spdlog::stderr_color_mt("headwise");
  logger->set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(flags.quiet     ? spdlog::level::err
                    : flags.verbose ? spdlog::level::debug
                                    : spdlog::level::info);
}

}  // namespace headwise::cli

#pragma once
// Each subcommand lives in one file under src/cli/ and registers itself; main.cpp only
// builds the CLI11 app from the registered commands and maps errors to exit codes.
#include <CLI/CLI.hpp>

#include "headwise/arch/visible_keys.hpp"

#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace headwise::cli {

// Adds the command's subcommand (or, for the main job, the root options) to `root`.
using CommandSetup = std::function<void(CLI::App& root)>;

struct CommandEntry {
  std::string name;
  CommandSetup setup;
};

std::vector<CommandEntry>& registered_commands();

struct RegisterCommand {
  RegisterCommand(std::string name, CommandSetup setup) {
    registered_commands().push_back({std::move(name), std::move(setup)});
  }
};

struct CommonFlags {
  bool quiet = false;
  bool verbose = false;
  bool json = false;
};

// --quiet / --verbose (and --json when asked) on a (sub)command.
void add_common_flags(CLI::App* app, CommonFlags& flags, bool with_json);
// --runtime-attention fused|explicit: the runtime decoder's attention kernel (runtime/decoder.hpp),
// read into `name` and turned into the kernel (or a one-line error) by runtime_attention_kernel.
CLI::Option* add_runtime_attention_option(CLI::App* app, std::string& name);
arch::AttentionKernel runtime_attention_kernel(const std::string& name);
// Sets spdlog's level from the flags; logs go to stderr so stdout stays machine-readable.
void apply_logging(const CommonFlags& flags);
// An output written when the work ends fails before the work, in one line, when the folder it goes
// into does not exist: "<label>: output folder <folder> does not exist".
void require_output_folder(const std::string& path, std::string_view label);

// The flag the user writes for a library field ("threads_per_worker": --threads-per-job); a
// field without an entry in cli/command.cpp's table is the option convention (seq_len: --seq-len).
std::string flag_for(std::string_view field);
// What the user sees for an error: library errors that name fields name them by their flags.
std::string user_message(const std::exception& error);

// Exit codes.
inline constexpr int kExitInputError = 1;
inline constexpr int kExitInfeasible = 3;
inline constexpr int kExitNumeric = 4;
inline constexpr int kExitInternal = 5;

}  // namespace headwise::cli

// headwise-calc: one binary, subcommands registered by the files in src/cli/.
#include <spdlog/spdlog.h>

#include <iostream>

#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/resources.hpp"

int main(int argc, char** argv) {
  using namespace headwise;
  tune_allocator_for_tensor_reuse();
  CLI::App app{
      "headwise-calc: compile per-KV-head cache window policies for hybrid long-context LLMs.\n"
      "Sizes take k/m/g suffixes in powers of 1024 (160k tokens = 163840, 48g = 48 GiB)."};
  app.set_version_flag("--version", HEADWISE_VERSION);
  app.require_subcommand(0, 1);
  for (const auto& command : cli::registered_commands()) command.setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const InfeasibleError& e) {
    std::cerr << "headwise-calc: error: " << cli::user_message(e) << "\n";
    return cli::kExitInfeasible;
  } catch (const NumericError& e) {
    std::cerr << "headwise-calc: error: " << cli::user_message(e) << "\n";
    return cli::kExitNumeric;
  } catch (const InputError& e) {
    std::cerr << "headwise-calc: error: " << cli::user_message(e) << "\n";
    return cli::kExitInputError;
  } catch (const std::exception& e) {
    std::cerr << "headwise-calc: error: " << cli::user_message(e) << "\n";
    return cli::kExitInternal;
  }
  return 0;
}

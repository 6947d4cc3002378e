// headwise-calc tokenize-bench (hidden): times the C++ tokenizer on a text file, for
// tools/bench_tokenizer.py, which runs `tokenizers` on the same text in the same process run.
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/tokenize/tokenizer.hpp"

namespace headwise::cli {
namespace {

struct BenchOptions {
  std::string tokenizer, input;
  int rounds = 3;
};

void run_bench(const BenchOptions& options) {
  if (options.rounds < 1) throw_input_error("--rounds {}: must be at least 1", options.rounds);
  const auto tokenizer = tokenize::Tokenizer::from_file(options.tokenizer);
  const std::string text = read_text_file(options.input);
  double best = 1e300;
  size_t tokens = 0;
  for (int round = 0; round < options.rounds; ++round) {
    // Best of several rounds, like the Python side: the first pays for cache warm-up.
    const auto start = std::chrono::steady_clock::now();
    tokens = tokenizer.encode(text, false).size();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const nlohmann::json result = {{"tokens", tokens},
                                 {"bytes", text.size()},
                                 {"seconds", best},
                                 {"tokens_per_second", static_cast<double>(tokens) / best}};
  std::cout << result.dump() << "\n";
}

const RegisterCommand kRegister("tokenize-bench", [](CLI::App& root) {
  auto options = std::make_shared<BenchOptions>();
  auto* app =
      root.add_subcommand("tokenize-bench", "Time the tokenizer on a text file (JSON on stdout)");
  app->group("");  // hidden: a developer tool behind tools/bench_tokenizer.py
  app->add_option("--tokenizer", options->tokenizer, "tokenizer.json or its folder")->required();
  app->add_option("--input", options->input, "UTF-8 text file")->required();
  app->add_option("--rounds", options->rounds, "Timed rounds; the best is reported")
      ->capture_default_str();
  app->callback([options] { run_bench(*options); });
});

}  // namespace
}  // namespace headwise::cli

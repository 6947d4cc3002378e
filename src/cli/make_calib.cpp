// headwise-calc make-calib: writes a synthetic calibration set (RULER / LoCoMo style) as JSONL.
#include <spdlog/spdlog.h>

#include <memory>
#include <optional>

#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/units.hpp"
#include "headwise/tasks/generators.hpp"
#include "headwise/tokenize/tokenizer.hpp"

namespace headwise::cli {
namespace {

struct MakeCalibOptions {
  std::string task, length = "4k", tokenizer, output, haystack;
  int64_t samples = 8;
  uint64_t seed = 0;
  CommonFlags common;
};

void run_make_calib(const MakeCalibOptions& options) {
  apply_logging(options.common);
  tasks::GeneratorRequest request;
  request.task = options.task;
  request.length = parse_token_count(options.length, "--length");
  request.samples = options.samples;
  request.seed = options.seed;
  request.haystack_dir = options.haystack;
  std::optional<tokenize::Tokenizer> tokenizer;
  if (!options.tokenizer.empty()) {
    tokenizer.emplace(tokenize::Tokenizer::from_file(options.tokenizer));
  } else {
    spdlog::warn(
        "no --tokenizer: lengths are counted in UTF-8 bytes, which over-counts real tokens (about "
        "3-4x "
        "for English), so records will be shorter than {} model tokens",
        request.length);
  }
  const auto counter = tasks::make_token_counter(tokenizer ? &*tokenizer : nullptr);
  const auto records = tasks::generate_calibration(request, *counter);
  std::string jsonl;
  int64_t tokens = 0;
  for (const auto& record : records) {
    jsonl += record.dump() + "\n";
    tokens += record["tokens"].get<int64_t>();
  }
  write_file_atomically(options.output, jsonl);
  spdlog::info("wrote {} {} records ({} tokens by {}) to {}", records.size(), request.task, tokens,
               counter->name(), options.output);
}

const RegisterCommand kRegister("make-calib", [](CLI::App& root) {
  auto options = std::make_shared<MakeCalibOptions>();
  std::string tasks;
  for (const auto& name : tasks::generator_tasks()) tasks += (tasks.empty() ? "" : ", ") + name;
  auto* app = root.add_subcommand("make-calib",
                                  "Generate a synthetic long-context calibration set (JSONL)");
  app->add_option("--task", options->task, "Task: " + tasks)->required();
  app->add_option("--length", options->length, "Target tokens per record (k/m suffixes: 4k = 4096)")
      ->capture_default_str();
  app->add_option("--samples", options->samples, "Number of records")->capture_default_str();
  app->add_option("--seed", options->seed, "Random seed (same seed, same file)")
      ->capture_default_str();
  app->add_option("--tokenizer", options->tokenizer,
                  "Model folder or tokenizer.json that measures lengths (default: UTF-8 bytes)");
  app->add_option("--haystack", options->haystack,
                  "Folder of haystack .txt files (default: calib-data/haystack)");
  app->add_option("-o,--output", options->output, "Output JSONL file")->required();
  add_common_flags(app, options->common, false);
  app->callback([options] { run_make_calib(*options); });
});

}  // namespace
}  // namespace headwise::cli

#pragma once
// Synthetic long-context calibration data following RULER's task definitions (needle in a
// haystack: single / multi-key / multi-value / multi-query, variable tracking, common-words
// extraction, QA with distractors) plus LoCoMo-style multi-session dialogue recall.
// Every record is a JSON object with "text" (prompt followed by the expected answer, what
// calibration reads), "answer_text" (that final suffix: the prompt is text without it),
// "answers", "task", "params", "tokens" and "token_counter".
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace headwise::tokenize {
class Tokenizer;
}

namespace headwise::tasks {

// Measures lengths in tokens: a model's tokenizer, or (without one) UTF-8 bytes, which
// over-counts real tokens about 3-4x, so byte-counted records come out shorter in tokens.
class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  virtual int64_t count(std::string_view text) const = 0;
  virtual std::string name() const = 0;
};
std::unique_ptr<TokenCounter> make_token_counter(const tokenize::Tokenizer* tokenizer);

struct GeneratorRequest {
  std::string task;
  int64_t length = 0;  // target tokens per record (records never exceed it)
  int64_t samples = 0;
  uint64_t seed = 0;
  std::filesystem::path
      haystack_dir;  // empty: calib-data/haystack of data_dir() (core/data_dir.hpp)
};

const std::vector<std::string>& generator_tasks();

// Deterministic for a given request and token counter. Throws InputError for an unknown
// task, a non-positive length or sample count, or a length too short for the task.
std::vector<nlohmann::json> generate_calibration(const GeneratorRequest& request,
                                                 const TokenCounter& counter);

}  // namespace headwise::tasks

#include "headwise/tasks/generators.hpp"

#include <spdlog/spdlog.h>

#include <map>

#include "headwise/core/error.hpp"
#include "headwise/tokenize/tokenizer.hpp"
#include "text_tasks.hpp"

namespace headwise::tasks {
namespace {

class TokenizerCounter final : public TokenCounter {
 public:
  explicit TokenizerCounter(const tokenize::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // With special tokens: the length the model sees when the record is used for calibration.
  int64_t count(std::string_view text) const override {
    return static_cast<int64_t>(tokenizer_.encode(text, true).size());
  }
  std::string name() const override {
    return "tokenizer:" + tokenizer_.path().parent_path().filename().string();
  }

 private:
  const tokenize::Tokenizer& tokenizer_;
};

class ByteCounter final : public TokenCounter {
 public:
  int64_t count(std::string_view text) const override { return static_cast<int64_t>(text.size()); }
  std::string name() const override { return "utf8-bytes"; }
};

using TaskFn = nlohmann::json (*)(const TaskContext&);

const std::map<std::string, TaskFn>& task_table() {
  // RULER's defaults: multikey 4 keys, multivalue 4 values, multiquery 4 queried keys.
  static const std::map<std::string, TaskFn> table = {
      {"niah_single", [](const TaskContext& c) { return make_niah(c, 1, 1, 1); }},
      {"niah_multikey", [](const TaskContext& c) { return make_niah(c, 4, 1, 1); }},
      {"niah_multivalue", [](const TaskContext& c) { return make_niah(c, 1, 4, 1); }},
      {"niah_multiquery", [](const TaskContext& c) { return make_niah(c, 4, 1, 4); }},
      {"variable_tracking", &make_variable_tracking},
      {"common_words", &make_common_words},
      {"qa_distractors", &make_qa_distractors},
      {"locomo", &make_locomo},
  };
  return table;
}

// Each sample gets its own stream so that sample i is the same whatever K is.
uint64_t sample_seed(uint64_t seed, const std::string& task, int64_t index) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the task name, portable unlike std::hash
  for (unsigned char c : task) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed + h + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64 finaliser
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::unique_ptr<TokenCounter> make_token_counter(const tokenize::Tokenizer* tokenizer) {
  if (tokenizer) return std::make_unique<TokenizerCounter>(*tokenizer);
  return std::make_unique<ByteCounter>();
}

const std::vector<std::string>& generator_tasks() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, fn] : task_table()) out.push_back(name);
    return out;
  }();
  return names;
}

std::vector<nlohmann::json> generate_calibration(const GeneratorRequest& request,
                                                 const TokenCounter& counter) {
  const auto it = task_table().find(request.task);
  if (it == task_table().end()) {
    std::string names;
    for (const auto& name : generator_tasks()) names += (names.empty() ? "" : ", ") + name;
    throw_field_error("task", " {}: unknown task (have: {})", request.task, names);
  }
  if (request.length <= 0) throw_field_error("length", " {}: must be positive", request.length);
  if (request.samples <= 0) throw_field_error("samples", " {}: must be positive", request.samples);
  const Haystack& haystack = load_haystack(request.haystack_dir);
  std::vector<nlohmann::json> records;
  for (int64_t i = 0; i < request.samples; ++i) {
    Rng rng(sample_seed(request.seed, request.task, i));
    auto record = it->second(TaskContext{request, counter, haystack, i, rng});
    record["params"]["seed"] = request.seed;
    record["params"]["sample"] = i;
    record["params"]["length"] = request.length;
    records.push_back(std::move(record));
    spdlog::debug("{} sample {}: {} tokens", request.task, i,
                  records.back()["tokens"].get<int64_t>());
  }
  return records;
}

}  // namespace headwise::tasks

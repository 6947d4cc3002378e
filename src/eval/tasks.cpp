#include "headwise/eval/tasks.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

#include "headwise/core/error.hpp"
#include "headwise/tasks/generators.hpp"
#include "headwise/tasks/synthetic.hpp"
#include "headwise/tokenize/tokenizer.hpp"

namespace headwise::eval {
namespace {

namespace fs = std::filesystem;

// Token-level needle tasks: name → key→value pairs planted in the haystack. Independent needles:
// the last query's value (the sequence's final kValueLen tokens) is the answer. A chain (variable
// tracking, tasks::synthetic_chain_set): the answer is every hop's value from the first query on,
// each later query's key being the model's own answer to the hop before.
struct TokenTask {
  const char* name;
  int64_t needles;
  bool chained = false;
};
constexpr TokenTask kTokenTasks[] = {{"needle_single", 1},
                                     {"needle_multikey", 4},
                                     {"needle_multikey8", 8},
                                     {"needle_chain", 4, true}};
constexpr int64_t kKeyLen = tasks::kSyntheticKeyLen;
constexpr int64_t kValueLen = tasks::kSyntheticValueLen;
constexpr int64_t kQueryLen = 2 + kKeyLen + kValueLen;  // marker, key, separator, value

const std::vector<std::string> kDefaultTextTasks{"niah_single", "niah_multikey", "niah_multivalue",
                                                 "variable_tracking"};

std::string without_whitespace(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) == 0) out.push_back(c);
  }
  return out;
}

// A tokenizer made for another alphabet (the default model's is 512 one-character tokens)
// silently drops what it cannot write; a task it cannot write is no test of the model. `ids`
// are `text` encoded; spaces are ignored: decoders legitimately move them (SentencePiece's
// leading "▁"), and special tokens the encoder added are skipped.
bool decodes_back(const tokenize::Tokenizer& tokenizer, const std::vector<int64_t>& ids,
                  std::string_view text) {
  return without_whitespace(tokenizer.decode(ids, true)) == without_whitespace(text);
}

std::vector<std::string> default_tasks_for(const tokenize::Tokenizer* tokenizer) {
  constexpr std::string_view kProbe =
      "The special magic number for the key is: 7412 and that is it.";
  if (tokenizer != nullptr && decodes_back(*tokenizer, tokenizer->encode(kProbe, false), kProbe))
    return kDefaultTextTasks;
  return {"needle_single", "needle_multikey", "needle_chain"};
}

bool has_tokenizer(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "tokenizer.json", ec);
}

std::string token_task_names() {
  std::string out;
  for (const auto& t : kTokenTasks) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

bool is_token_task(const std::string& name) {
  return std::any_of(std::begin(kTokenTasks), std::end(kTokenTasks),
                     [&](const TokenTask& t) { return name == t.name; });
}

// A chain's sequence ends with `hops` queries. The prompt stops after the first query's separator;
// the model answers its value, then each later query (marker, key, separator) is fed with the
// key copied from the model's own previous value, and the model answers that hop's value.
EvalSample chain_sample(const std::string& task, const std::vector<int64_t>& seq, int64_t hops) {
  const auto first_answer =
      static_cast<std::ptrdiff_t>(seq.size()) - hops * kQueryLen + 2 + kKeyLen;
  EvalSample s;
  s.task = task;
  s.prompt.assign(seq.begin(), seq.begin() + first_answer);
  s.answer.assign(seq.begin() + first_answer, seq.end());
  int64_t previous_value = 0;
  for (int64_t hop = 0; hop < hops; ++hop) {
    if (hop > 0) {
      s.answer_source.push_back(kGivenToken);  // marker
      for (int64_t i = 0; i < kKeyLen; ++i) s.answer_source.push_back(previous_value + i);
      s.answer_source.push_back(kGivenToken);  // separator
    }
    previous_value = static_cast<int64_t>(s.answer_source.size());
    for (int64_t i = 0; i < kValueLen; ++i) s.answer_source.push_back(kGeneratedToken);
  }
  HEADWISE_CHECK(s.answer_source.size() == s.answer.size(), "chain answer {} tokens, sources {}",
                 s.answer.size(), s.answer_source.size());
  return s;
}

std::vector<EvalSample> token_task_samples(const TokenTask& task, int64_t vocab,
                                           const TaskRequest& r) {
  tasks::SyntheticOptions o;
  o.vocab_size = vocab;
  o.samples = r.samples;
  o.seq_len = r.seq_len;
  // Each task gets its own stream so adding a task never changes another's samples.
  o.seed = r.seed * 1000003 + static_cast<uint64_t>(task.needles) + (task.chained ? 1000 : 0);
  o.needles = task.needles;
  std::vector<EvalSample> out;
  if (task.chained) {
    for (const auto& seq : tasks::synthetic_chain_set(o))
      out.push_back(chain_sample(task.name, seq, task.needles));
    return out;
  }
  for (auto& seq : tasks::synthetic_retrieval_set(o)) {
    EvalSample s;
    s.task = task.name;
    s.answer.assign(seq.end() - kValueLen, seq.end());
    s.prompt.assign(seq.begin(), seq.end() - kValueLen);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<EvalSample> text_task_samples(const std::string& task,
                                          const tokenize::Tokenizer& tokenizer,
                                          const TaskRequest& r) {
  const auto counter = tasks::make_token_counter(&tokenizer);
  tasks::GeneratorRequest g;
  g.task = task;
  g.length = r.seq_len;
  g.samples = r.samples;
  g.seed = r.seed;
  std::vector<EvalSample> out;
  for (const auto& record : tasks::generate_calibration(g, *counter)) {
    const std::string text = record.at("text").get<std::string>();
    const std::string answer_text = record.at("answer_text").get<std::string>();
    const std::string prompt_text = text.substr(0, text.size() - answer_text.size());
    const auto whole = tokenizer.encode(text, true);
    if (!decodes_back(tokenizer, whole, text)) {
      throw_field_error(
          "tasks",
          " {}: the model's tokenizer.json cannot write this task's English text (it does not "
          "decode back to itself); use the token tasks {}",
          task, token_task_names());
    }
    EvalSample s;
    s.task = task;
    s.prompt = tokenizer.encode(prompt_text, true);
    // The answer as the model would produce it after this prompt: the whole text's tokens past
    // the prompt's, when the prompt tokenizes to a prefix of the whole (no merge across the cut).
    if (whole.size() > s.prompt.size() &&
        std::equal(s.prompt.begin(), s.prompt.end(), whole.begin())) {
      s.answer.assign(whole.begin() + static_cast<std::ptrdiff_t>(s.prompt.size()), whole.end());
    } else {
      s.answer = tokenizer.encode(answer_text, false);
    }
    if (s.answer.empty()) throw_field_error("tasks", " {}: sample with an empty answer", task);
    if (static_cast<int64_t>(s.prompt.size() + s.answer.size()) > r.seq_len) {
      // The generator measured with the same tokenizer; a longer result means the cut merged.
      s.prompt.erase(s.prompt.begin(), s.prompt.begin() + static_cast<std::ptrdiff_t>(
                                                              s.prompt.size() + s.answer.size() -
                                                              static_cast<size_t>(r.seq_len)));
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

std::vector<std::string> available_tasks(const fs::path& model_dir) {
  std::vector<std::string> out;
  for (const auto& t : kTokenTasks) out.push_back(t.name);
  if (has_tokenizer(model_dir)) {
    for (const auto& t : tasks::generator_tasks()) out.push_back(t);
  }
  return out;
}

std::vector<std::string> default_tasks(const fs::path& model_dir) {
  if (!has_tokenizer(model_dir)) return default_tasks_for(nullptr);
  const auto tokenizer = tokenize::Tokenizer::from_file(model_dir / "tokenizer.json");
  return default_tasks_for(&tokenizer);
}

std::vector<int64_t> generated_answer_indices(const EvalSample& s) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < s.answer.size(); ++i) {
    if (s.answer_source.empty() || s.answer_source[i] == kGeneratedToken)
      out.push_back(static_cast<int64_t>(i));
  }
  return out;
}

TeacherForced teacher_forced(const EvalSample& s) {
  TeacherForced out;
  out.tokens = s.prompt;
  out.tokens.insert(out.tokens.end(), s.answer.begin(), s.answer.end() - 1);
  out.first_answer_row = static_cast<int64_t>(s.prompt.size()) - 1;
  for (int64_t i : generated_answer_indices(s))
    out.generated_rows.push_back(out.first_answer_row + i);
  return out;
}

std::vector<EvalSample> make_eval_samples(const fs::path& model_dir, int64_t vocab_size,
                                          const TaskRequest& request) {
  if (request.samples <= 0)
    throw_field_error("samples", " must be positive, got {}", request.samples);
  if (request.seq_len <= 0)
    throw_field_error("seq_len", " must be positive, got {}", request.seq_len);
  // Loaded once, when the defaults or a text task need it.
  std::optional<tokenize::Tokenizer> tokenizer;
  auto loaded_tokenizer = [&]() -> const tokenize::Tokenizer& {
    if (!tokenizer) tokenizer.emplace(tokenize::Tokenizer::from_file(model_dir / "tokenizer.json"));
    return *tokenizer;
  };
  const auto tasks = !request.tasks.empty()     ? request.tasks
                     : has_tokenizer(model_dir) ? default_tasks_for(&loaded_tokenizer())
                                                : default_tasks_for(nullptr);
  const auto text_tasks = tasks::generator_tasks();
  std::vector<EvalSample> out;
  for (const auto& task : tasks) {
    std::vector<EvalSample> samples;
    if (is_token_task(task)) {
      const auto& t = *std::find_if(std::begin(kTokenTasks), std::end(kTokenTasks),
                                    [&](const TokenTask& x) { return task == x.name; });
      samples = token_task_samples(t, vocab_size, request);
    } else if (std::find(text_tasks.begin(), text_tasks.end(), task) != text_tasks.end()) {
      if (!has_tokenizer(model_dir)) {
        throw_field_error("tasks",
                          " {}: a text task needs {}; this model has none (token tasks: {})", task,
                          (model_dir / "tokenizer.json").string(), token_task_names());
      }
      samples = text_task_samples(task, loaded_tokenizer(), request);
    } else {
      std::string names;
      for (const auto& n : available_tasks(model_dir)) names += (names.empty() ? "" : ", ") + n;
      throw_field_error("tasks", " {}: unknown task (have: {})", task, names);
    }
    out.insert(out.end(), samples.begin(), samples.end());
  }
  return out;
}

}  // namespace headwise::eval

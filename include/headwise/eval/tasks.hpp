#pragma once
// Evaluation samples: a prompt and the exact answer tokens a greedy continuation must produce.
// With the model's tokenizer.json the project's RULER/LoCoMo-style text generators are used
// (tasks/generators.hpp); without one, token-level needle tasks over the model's vocabulary
// (tasks/synthetic.hpp's key→value retrieval sequences, asking for the last key's value).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace headwise::eval {

// Where an answer token comes from in greedy decoding (EvalSample::answer_source). A multi-hop
// answer interleaves the harness's query tokens with the model's: a given token is fed as is; a
// copied one (source >= 0) repeats what the model itself produced at that earlier answer index,
// never the reference, so a hop answered wrong corrupts the next hop's query, as it would in use.
inline constexpr int64_t kGeneratedToken = -1;
inline constexpr int64_t kGivenToken = -2;

struct EvalSample {
  std::string task;
  std::vector<int64_t> prompt;
  std::vector<int64_t> answer;  // non-empty
  // Empty: the model generates every answer token. Else one entry per answer token:
  // kGeneratedToken, kGivenToken, or the index of an earlier generated answer token it copies.
  // The sample is right when every token the model produced equals the answer's.
  std::vector<int64_t> answer_source;
};

// The answer indices the model must produce itself (all of them for a plain answer), ascending.
std::vector<int64_t> generated_answer_indices(const EvalSample& sample);

// A sample as one teacher-forced sequence: the prompt and the answer without its last token;
// the outputs at positions first_answer_row.. are the answer tokens, and those at generated_rows
// the tokens the model generates (all of them for a plain answer; a multi-hop answer's queries
// are the harness's).
struct TeacherForced {
  std::vector<int64_t> tokens;
  int64_t first_answer_row = 0;
  std::vector<int64_t> generated_rows;
};
TeacherForced teacher_forced(const EvalSample& sample);

struct TaskRequest {
  std::vector<std::string> tasks;  // empty: default_tasks()
  int64_t samples = 8;             // per task
  int64_t seq_len = 2048;          // prompt + answer tokens, at most
  uint64_t seed = 0;
};

// Names eval accepts for this model directory (text tasks need tokenizer.json).
std::vector<std::string> available_tasks(const std::filesystem::path& model_dir);
std::vector<std::string> default_tasks(const std::filesystem::path& model_dir);

// Throws InputError naming --tasks for an unknown task (listing the available ones) or a task
// that needs a tokenizer the model lacks, and naming --seq-len / --samples for bad sizes.
std::vector<EvalSample> make_eval_samples(const std::filesystem::path& model_dir,
                                          int64_t vocab_size, const TaskRequest& request);

}  // namespace headwise::eval

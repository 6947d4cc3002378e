#pragma once
// Evaluation samples: a prompt and the exact answer tokens a greedy continuation must produce.
// With the model's tokenizer.json the project's RULER/LoCoMo-style text generators are used
// (calib/generators.hpp); without one, token-level needle tasks over the model's vocabulary
// (calib/synthetic.hpp's key→value retrieval sequences, asking for the last key's value).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace headwise::eval {

struct EvalSample {
  std::string task;
  std::vector<int64_t> prompt;
  std::vector<int64_t> answer;  // non-empty
};

// A sample as one teacher-forced sequence: the prompt and the answer without its last token;
// the outputs at positions first_answer_row.. are the answer tokens.
struct TeacherForced {
  std::vector<int64_t> tokens;
  int64_t first_answer_row = 0;
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
std::vector<EvalSample> make_eval_samples(const std::filesystem::path& model_dir, int64_t vocab_size,
                                          const TaskRequest& request);

}  // namespace headwise::eval

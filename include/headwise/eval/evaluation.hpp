#pragma once
// One evaluation, start to end: policies in, the document `eval --json` prints out. The request
// is what the command line parsed (the policies already read and checked against the model);
// everything eval decides — which samples, which methods in which order, which runs share work,
// what the document says and how the policy compares with each method — happens here.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "headwise/eval/eval.hpp"
#include "headwise/eval/tasks.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::eval {

// A policy to evaluate, and the same calibration with --no-conditioning when given (the exact
// `unconditioned` ablation; absent: eval calibrates one on its own calibration samples).
struct PolicyUnderTest {
  std::string path;  // as the caller named it: the document's "policy"
  policy::Policy policy;
  std::optional<policy::Policy> unconditioned = std::nullopt;
  std::string unconditioned_path = {};  // names it in errors
};

// Field names in errors are the request's (seq_len, calib_samples, ...): the CLI's flags.
struct EvaluationRequest {
  std::filesystem::path model_dir;  // the model folder (resolved): the document's "model"
  // Every policy must match the model (the caller checks fingerprints); several policies must
  // share the serving shape, as they share the samples and the full-KV reference.
  std::vector<PolicyUnderTest> policies;
  std::vector<std::string> tasks;                         // empty: default_tasks(model_dir)
  std::vector<std::string> baselines = baseline_names();  // in report order after the policy
  int64_t samples = 100;                                  // per task
  std::optional<int64_t> seq_len;                         // unset: the policies' context
  bool allow_short_seq_len = false;
  int64_t calib_samples = 4;  // per task: retrieval scores, duo's gates, unconditioned's curves
  int64_t duo_steps = DuoTrainingOptions{}.steps;
  uint64_t seed = 0;  // the samples' and the random baseline's
  RunOptions run;
  std::string device = "cpu";
  int64_t jobs = 1;             // method runs at once, one model instance each (schedule.hpp)
  int64_t threads_per_job = 0;  // 0: the process's threads / jobs
};

// The samples the request's evaluation answers (the request checked first, as for a run): what
// `eval --write-samples` hands to another runtime.
std::vector<EvalSample> evaluation_samples(const EvaluationRequest& request);

// `samples` as JSON lines ({"task", "prompt", "answer", "answer_source"} each).
std::string samples_jsonl(const std::vector<EvalSample>& samples);

// What one evaluation gives: the document, and what every method decoded on every sample.
struct Evaluation {
  // One policy: its evaluation (model, policy, serving shape, samples, methods in report order,
  // methods_not_fitting, paired_vs_headwise); several: {"evaluations": [...]}, one each in the
  // request's order. What `eval --json` prints.
  nlohmann::json document;
  // One JSON line per (policy, method that ran, sample), in the document's order and then sample
  // order: {"policy", "method", "task", "index" (within its task), "sample" (the line of
  // --write-samples), "prompt_tokens", "prompt_sha256" (prompt_sha256 below), "generated" (the
  // answer tokens the greedy harness produced: greedy_answer), "right"}. What `eval
  // --write-tokens` writes, so another runtime's tokens can be compared with these token by token.
  std::string tokens_jsonl;
};

// Runs every policy against its baselines.
Evaluation evaluate(const EvaluationRequest& request);

// evaluate(request).document.
nlohmann::json run_evaluation(const EvaluationRequest& request);

// SHA-256 (lowercase hex) of the prompt's token ids written in decimal and joined by commas
// ("12,7,301"): names a prompt in --write-tokens without repeating it; in Python,
// hashlib.sha256(",".join(map(str, prompt)).encode()).hexdigest().
std::string prompt_sha256(const std::vector<int64_t>& prompt);

}  // namespace headwise::eval

// `headwise-calc eval`: the policy and baselines at the policy's bytes, run through the
// runtime decoder (windows applied physically) on retrieval tasks; accuracy, KL vs full,
// perplexity, cache bytes (measured and estimated), throughput. The evaluation itself is
// eval::run_evaluation; this file reads the flags and the policies, and prints.
#include <spdlog/spdlog.h>

#include <iostream>
#include <sstream>

#include "headwise/arch/registry.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/units.hpp"
#include "headwise/eval/evaluation.hpp"
#include "headwise/io/checkpoint.hpp"
#include "policy_check.hpp"

namespace headwise::cli {
namespace {

namespace fs = std::filesystem;

struct EvalArgs {
  std::string model;
  std::vector<std::string> policies;
  std::vector<std::string> unconditioned_policies;
  std::string tasks;
  std::string baselines = fmt::format("{}", fmt::join(eval::baseline_names(), ","));
  int64_t samples = 100;
  std::string seq_len = "context";  // the policy's context
  bool allow_short_seq_len = false;
  int64_t calib_samples = 4;
  int64_t duo_steps = eval::DuoTrainingOptions{}.steps;
  uint64_t seed = 0;
  int64_t prefill_chunk = 256;
  int64_t kl_positions = 512;
  std::string runtime_attention = "fused";
  std::string device = "cpu";
  int64_t jobs = 1;
  int64_t threads_per_job = 0;
  std::string write_samples;
  std::string write_tokens;
  CommonFlags flags;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The policies and their ablations as read from the flags, each checked against the model (a
// policy for another model would give meaningless numbers).
std::vector<eval::PolicyUnderTest> read_policies(const EvalArgs& args, const fs::path& dir,
                                                 const arch::ModelSpec& spec) {
  if (!args.unconditioned_policies.empty() &&
      args.unconditioned_policies.size() != args.policies.size()) {
    throw_input_error(
        "--unconditioned-policy given {} times for {} --policy; give one per policy, in the same "
        "order",
        args.unconditioned_policies.size(), args.policies.size());
  }
  std::vector<eval::PolicyUnderTest> out;
  for (size_t i = 0; i < args.policies.size(); ++i) {
    eval::PolicyUnderTest p{args.policies[i], policy::read_policy(args.policies[i])};
    check_policy_matches(p.policy, dir, spec, p.path);
    if (!args.unconditioned_policies.empty()) {
      p.unconditioned_path = args.unconditioned_policies[i];
      p.unconditioned = policy::read_policy(p.unconditioned_path);
      check_policy_matches(*p.unconditioned, dir, spec, p.unconditioned_path,
                           "--unconditioned-policy");
    }
    out.push_back(std::move(p));
  }
  return out;
}

eval::EvaluationRequest evaluation_request(const EvalArgs& args) {
  eval::EvaluationRequest r;
  r.model_dir = io::resolve_model_dir(args.model);
  r.policies = read_policies(args, r.model_dir, arch::load_model_spec(r.model_dir));
  r.tasks = split_list(args.tasks);
  r.baselines = split_list(args.baselines);
  r.samples = args.samples;
  if (args.seq_len != "context") r.seq_len = parse_token_count(args.seq_len, "--seq-len");
  r.allow_short_seq_len = args.allow_short_seq_len;
  r.calib_samples = args.calib_samples;
  r.duo_steps = args.duo_steps;
  r.seed = args.seed;
  r.run = {args.prefill_chunk, args.kl_positions, runtime_attention_kernel(args.runtime_attention)};
  r.device = args.device;
  r.jobs = args.jobs;
  r.threads_per_job = args.threads_per_job;
  return r;
}

// One policy's evaluation as a table: a row per method that ran (accuracy per task with its 95%
// interval), then the methods that could not fit the bytes, and why.
void print_table(const nlohmann::json& evaluation) {
  const auto tasks = evaluation.at("tasks").get<std::vector<std::string>>();
  std::string header = fmt::format("{:<14} {:>14} {:>14}", "method", "cache_est", "cache_meas");
  for (const auto& t : tasks) header += fmt::format(" {:>17}", t);
  header +=
      fmt::format(" {:>10} {:>10} {:>11} {:>10}", "kl_vs_full", "ppl", "prefill t/s", "decode t/s");
  std::cout << header << "\n";
  for (const nlohmann::json& m : evaluation.at("methods")) {
    std::string line = fmt::format("{:<14} {:>14} {:>14}", m.at("name").get<std::string>(),
                                   m.at("cache_bytes_estimated").get<int64_t>(),
                                   m.at("cache_bytes_measured").get<int64_t>());
    for (const auto& t : tasks) {
      const nlohmann::json& counts = m.at("tasks_counts");
      const auto [lo, hi] = counts.contains(t)
                                ? eval::wilson_interval(counts[t].at("right").get<int64_t>(),
                                                        counts[t].at("total").get<int64_t>())
                                : eval::wilson_interval(0, 0);
      const double accuracy = m.at("tasks").contains(t) ? m["tasks"][t].get<double>() : 0.0;
      line += fmt::format(" {:>5.3f} [{:.2f},{:.2f}]", accuracy, lo, hi);
    }
    line +=
        fmt::format(" {:>10.4g} {:>10.4g} {:>11.1f} {:>10.1f}", m.at("kl_vs_full").get<double>(),
                    m.at("perplexity").get<double>(), m.at("prefill_tokens_per_s").get<double>(),
                    m.at("decode_tokens_per_s").get<double>());
    std::cout << line << "\n";
  }
  for (const nlohmann::json& m : evaluation.at("methods_not_fitting")) {
    std::cout << m.at("name").get<std::string>()
              << ": not run: " << m.at("reason").get<std::string>() << "\n";
  }
}

void print_tables(const nlohmann::json& document) {
  if (!document.contains("evaluations")) return print_table(document);
  for (const nlohmann::json& evaluation : document["evaluations"]) {
    std::cout << "policy " << evaluation.at("policy").get<std::string>() << "\n";
    print_table(evaluation);
  }
}

// --write-tokens is written after the whole evaluation: a bad path fails now, in one line, not
// after the runs.
void check_write_tokens(const EvalArgs& args) {
  if (args.write_tokens.empty()) return;
  if (!args.write_samples.empty()) {
    throw_input_error(
        "--write-tokens {}: --write-samples stops before anything is decoded; run the eval once "
        "with --write-samples and once with --write-tokens",
        args.write_tokens);
  }
  require_output_folder(args.write_tokens, "--write-tokens " + args.write_tokens);
  if (fs::is_directory(args.write_tokens))
    throw_input_error("--write-tokens {}: is a folder, not a file", args.write_tokens);
}

void run_eval(const EvalArgs& args) {
  apply_logging(args.flags);
  check_write_tokens(args);
  const eval::EvaluationRequest request = evaluation_request(args);
  if (!args.write_samples.empty()) {
    // The samples as JSON lines, so that another runtime (transformers with kvpress's presses,
    // tools/peers_eval.py) answers exactly the samples this eval would.
    const auto samples = eval::evaluation_samples(request);
    write_file_atomically(args.write_samples, eval::samples_jsonl(samples));
    spdlog::info("eval: wrote {} samples to {}; nothing evaluated", samples.size(),
                 args.write_samples);
    return;
  }
  const eval::Evaluation evaluation = eval::evaluate(request);
  if (!args.write_tokens.empty()) {
    write_file_atomically(args.write_tokens, evaluation.tokens_jsonl);
    spdlog::info("eval: wrote every method's decoded answer tokens to {}", args.write_tokens);
  }
  if (args.flags.json) {
    std::cout << evaluation.document.dump(2) << "\n";
  } else {
    print_tables(evaluation.document);
  }
}

const RegisterCommand kRegister{
    "eval", [](CLI::App& root) {
      static EvalArgs args;
      auto* cmd = root.add_subcommand(
          "eval", "Policy vs baselines at equal bytes through the runtime decoder");
      cmd->add_option("--model", args.model, "Model folder (config.json + safetensors)")
          ->required();
      cmd->add_option("--policy", args.policies,
                      "policy.yaml made for this model; repeat for several budgets of one serving "
                      "shape (a rate-quality "
                      "curve): they share the samples, full KV and the budget-free baseline work, "
                      "and --json then prints "
                      "{\"evaluations\": [...]}, one per policy in order")
          ->required()
          ->expected(1)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
      cmd->add_option("--unconditioned-policy", args.unconditioned_policies,
                      "The policy's calibration rerun with --no-conditioning: the `unconditioned` "
                      "baseline then differs "
                      "from the policy only in conditioning (default: calibrated in eval on the "
                      "eval tasks' samples); "
                      "one per --policy, in the same order")
          ->expected(1)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
      cmd->add_option("--tasks", args.tasks,
                      "Comma-separated tasks (default: the text tasks when the model's tokenizer "
                      "writes English, else "
                      "needle_single,needle_multikey,needle_chain; also needle_multikey8)");
      cmd->add_option("--samples", args.samples, "Samples per task")->capture_default_str();
      cmd->add_option(
             "--seq-len", args.seq_len,
             "Tokens per sample, prompt + answer (k = 1024); default: the policy's context")
          ->capture_default_str();
      cmd->add_flag("--allow-short-seq-len", args.allow_short_seq_len,
                    "Evaluate on samples not longer than the policy's largest finite window (a "
                    "warning says why that "
                    "comparison is unfair)");
      cmd->add_option("--baselines", args.baselines, "Comma-separated baselines")
          ->capture_default_str();
      cmd->add_option(
             "--calib-samples", args.calib_samples,
             "Samples per task for retrieval scores, duo gate training and unconditioned curves")
          ->capture_default_str();
      cmd->add_option("--duo-steps", args.duo_steps,
                      "Adam steps of the duo baseline's gate training (one sample each; "
                      "DuoAttention's paper trains 2000)")
          ->capture_default_str();
      cmd->add_option("--seed", args.seed, "Seed of the samples and of the random baseline")
          ->capture_default_str();
      cmd->add_option("--prefill-chunk", args.prefill_chunk, "Tokens per prefill chunk")
          ->capture_default_str();
      cmd->add_option("--kl-positions", args.kl_positions,
                      "Last prompt positions compared with full KV")
          ->capture_default_str();
      cmd->add_option("--device", args.device, "cpu, cuda, cuda:N")->capture_default_str();
      cmd->add_option("--jobs", args.jobs,
                      "Method runs at once, each on its own model instance (one more streamed "
                      "layer and activation set "
                      "per job); the figures do not depend on it at a fixed --threads-per-job")
          ->capture_default_str();
      cmd->add_option("--threads-per-job", args.threads_per_job,
                      "Intra-op threads of each job when --jobs > 1 (default: the process's "
                      "threads / jobs, at least 1)")
          ->capture_default_str();
      cmd->add_option("--write-samples", args.write_samples,
                      "Write the samples this eval would answer (JSON lines: task, prompt, answer, "
                      "answer_source) to FILE and stop; another runtime can then answer the same "
                      "samples (tools/peers_eval.py)");
      cmd->add_option("--write-tokens", args.write_tokens,
                      "Also write what every method that ran decoded on every sample to FILE "
                      "(JSON lines: policy, method, task, index within the task, sample, "
                      "prompt_tokens, prompt_sha256, generated token ids, right), so another "
                      "runtime's tokens can be compared token by token "
                      "(tests/python/test_snap_serving.py)");
      add_runtime_attention_option(cmd, args.runtime_attention);
      add_common_flags(cmd, args.flags, /*with_json=*/true);
      cmd->callback([] { run_eval(args); });
    }};

}  // namespace
}  // namespace headwise::cli

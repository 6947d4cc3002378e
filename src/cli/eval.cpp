// `headwise-calc eval`: the policy and baselines at the policy's bytes, run through the
// runtime decoder (windows applied physically) on retrieval tasks; accuracy, KL vs full,
// perplexity, cache bytes (measured and estimated), throughput.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <sstream>

#include "headwise/arch/context_guard.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/units.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/eval/schedule.hpp"
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
  std::string baselines =
      "full,uniform,streamingllm,pyramid-windows,retrieval-score,duo,random,unconditioned,h2o,"
      "snapkv,adakv,pyramidkv,"
      "snapkv-chunked,adakv-chunked,pyramidkv-chunked,h2o-headwise-slots,snapkv-headwise-slots,"
      "adakv-headwise-slots,"
      "snapkv-chunked-headwise-slots,adakv-chunked-headwise-slots";
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

// A head whose window is at least the sample length truncates nothing: on samples shorter than
// the policy's windows, the policy and every baseline built to its bytes at its context look
// like full KV in part, and the comparison measures nothing the deployment will see.
void refuse_short_sequences(const policy::Policy& p, int64_t seq_len, bool allowed) {
  const int64_t largest = eval::largest_finite_window(p.head_windows());
  if (seq_len > largest) return;
  if (!allowed) {
    throw_input_error(
        "--seq-len {} is not longer than the policy's largest finite window ({} tokens): such "
        "windows "
        "truncate nothing there; evaluate at the policy's context (the default) or pass "
        "--allow-short-seq-len",
        seq_len, largest);
  }
  spdlog::warn(
      "--seq-len {} <= the policy's largest finite window ({}): heads with windows that long act "
      "as full KV "
      "on these samples, and baselines built to the policy's bytes at its context {} may too; the "
      "comparison "
      "does not show what the deployment will see",
      seq_len, largest, p.context);
}

// Methods whose every finite window covers the samples are full KV in effect: say so.
void warn_full_in_effect(const std::vector<eval::MethodWindows>& methods, int64_t seq_len) {
  for (const auto& m : methods) {
    if (m.name == "full" || m.does_not_fit) continue;
    bool truncates = false;
    for (const auto& [layer, heads] : m.windows) {
      for (int64_t w : heads) truncates = truncates || w < seq_len - 1;
    }
    if (!truncates)
      spdlog::warn("eval: {} truncates nothing on {}-token samples: it is full KV in effect",
                   m.name, seq_len);
  }
}

void print_table(const std::vector<eval::MethodWindows>& methods,
                 const std::vector<eval::MethodResult>& results,
                 const std::vector<std::string>& tasks) {
  std::string header = fmt::format("{:<14} {:>14} {:>14}", "method", "cache_est", "cache_meas");
  for (const auto& t : tasks) header += fmt::format(" {:>17}", t);
  header +=
      fmt::format(" {:>10} {:>10} {:>11} {:>10}", "kl_vs_full", "ppl", "prefill t/s", "decode t/s");
  std::cout << header << "\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const eval::MethodResult& r = results[i];
    if (methods[i].does_not_fit) continue;
    std::string line = fmt::format("{:<14} {:>14} {:>14}", r.name, r.cache_bytes_estimated,
                                   r.cache_bytes_measured);
    for (const auto& t : tasks) {
      const auto c = r.correct.count(t) ? r.correct.at(t) : std::pair<int64_t, int64_t>{0, 0};
      const auto [lo, hi] = eval::wilson_interval(c.first, c.second);
      line += fmt::format(" {:>5.3f} [{:.2f},{:.2f}]", r.accuracy.count(t) ? r.accuracy.at(t) : 0.0,
                          lo, hi);
    }
    line += fmt::format(" {:>10.4g} {:>10.4g} {:>11.1f} {:>10.1f}", r.kl_vs_full, r.perplexity,
                        r.prefill_tokens_per_s, r.decode_tokens_per_s);
    std::cout << line << "\n";
  }
  for (const auto& m : methods) {
    if (m.does_not_fit) std::cout << m.name << ": not run: " << *m.does_not_fit << "\n";
  }
}

// The evaluated samples as JSON lines, so that another runtime (transformers with kvpress's
// presses, tools/peers_eval.py) answers exactly the samples this eval would: the sample stream is
// headwise's, a function of the model's vocabulary, --tasks, --samples, --seq-len and --seed only.
void write_samples_jsonl(const fs::path& path, const std::vector<eval::EvalSample>& samples) {
  std::string out;
  for (const auto& s : samples) {
    out += nlohmann::json{{"task", s.task},
                          {"prompt", s.prompt},
                          {"answer", s.answer},
                          {"answer_source", s.answer_source}}
               .dump();
    out += "\n";
  }
  write_file_atomically(path, out);
}

std::string state_dtype_label(const policy::Policy& p) {
  return p.state_dtype ? std::string(dtype_name(*p.state_dtype)) : std::string("native (absent)");
}

// Policies evaluated together share their samples and the full-KV reference, so they must be
// served the same way: only their budgets (and so their windows) may differ.
void check_same_serving_shape(const policy::Policy& first, const std::string& first_path,
                              const policy::Policy& p, const std::string& path) {
  const auto differs = [&](const char* field, const std::string& a, const std::string& b) {
    throw_input_error(
        "--policy {}: {} is {}, but --policy {} has {}; policies evaluated together must share the "
        "context, KV dtype, state dtype, block size and sink tokens",
        path, field, b, first_path, a);
  };
  if (p.context != first.context)
    differs("context", std::to_string(first.context), std::to_string(p.context));
  if (p.dtype != first.dtype)
    differs("dtype", std::string(dtype_name(first.dtype)), std::string(dtype_name(p.dtype)));
  if (p.state_dtype != first.state_dtype)
    differs("state_dtype", state_dtype_label(first), state_dtype_label(p));
  if (p.block_size != first.block_size) {
    differs("block_size", std::to_string(first.block_size), std::to_string(p.block_size));
  }
  if (p.sink_tokens != first.sink_tokens) {
    differs("sink_tokens", std::to_string(first.sink_tokens), std::to_string(p.sink_tokens));
  }
}

struct PolicyUnderTest {
  std::string path;
  policy::Policy policy;
  std::optional<policy::Policy> ablation;  // its --unconditioned-policy
};

std::vector<PolicyUnderTest> read_policies(const EvalArgs& args, const fs::path& dir,
                                           const arch::ModelSpec& spec) {
  if (!args.unconditioned_policies.empty() &&
      args.unconditioned_policies.size() != args.policies.size()) {
    throw_input_error(
        "--unconditioned-policy given {} times for {} --policy; give one per policy, in the same "
        "order",
        args.unconditioned_policies.size(), args.policies.size());
  }
  std::vector<PolicyUnderTest> out;
  for (size_t i = 0; i < args.policies.size(); ++i) {
    PolicyUnderTest p{args.policies[i], policy::read_policy(args.policies[i]), std::nullopt};
    check_policy_matches(p.policy, dir, spec, p.path);
    if (!out.empty())
      check_same_serving_shape(out.front().policy, out.front().path, p.policy, p.path);
    if (!args.unconditioned_policies.empty()) {
      const std::string& where = args.unconditioned_policies[i];
      p.ablation = policy::read_policy(where);
      check_policy_matches(*p.ablation, dir, spec, where, "--unconditioned-policy");
      eval::check_unconditioned_ablation(p.policy, *p.ablation, where);
    }
    out.push_back(std::move(p));
  }
  return out;
}

nlohmann::json evaluation_json(const PolicyUnderTest& p, const memory::MemoryOptions& options,
                               const fs::path& dir, const arch::ModelSpec& spec,
                               const EvalArgs& args, int64_t seq_len,
                               const std::vector<std::string>& tasks,
                               const std::vector<eval::MethodWindows>& methods,
                               const std::vector<eval::MethodResult>& results) {
  nlohmann::json methods_json = nlohmann::json::array();
  nlohmann::json not_fitting = nlohmann::json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    if (methods[i].does_not_fit) {
      not_fitting.push_back({{"name", methods[i].name}, {"reason", *methods[i].does_not_fit}});
      continue;
    }
    nlohmann::json m = eval::to_json(results[i], spec);
    nlohmann::json details = methods[i].details;
    details.update(results[i].runtime_details);
    if (!details.empty()) m["details"] = details;
    methods_json.push_back(std::move(m));
  }
  // headwise against each other method on the same samples (first = headwise).
  nlohmann::json paired = nlohmann::json::object();
  const auto policy_result = std::find_if(results.begin(), results.end(),
                                          [](const auto& r) { return r.name == "headwise"; });
  if (policy_result != results.end()) {
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].name != "headwise" && !methods[i].does_not_fit)
        paired[results[i].name] =
            eval::to_json(eval::paired_comparison(*policy_result, results[i]));
    }
  }
  return {{"model", dir.string()},
          {"policy", p.path},
          {"context", options.context},
          {"batch", options.batch},
          {"kv_dtype", dtype_name(options.kv_dtype)},
          {"state_dtype", options.state_dtype
                              ? nlohmann::json(std::string(dtype_name(*options.state_dtype)))
                              : nlohmann::json("native")},
          {"seq_len", seq_len},
          {"samples_per_task", args.samples},
          {"seed", args.seed},
          {"tasks", tasks},
          {"policy_global_kv_bytes", eval::global_kv_bytes(spec, p.policy.head_windows(), options)},
          {"one_block_per_head_bytes", eval::one_block_per_head(spec, options)},
          {"methods", methods_json},
          // Requested baselines with no configuration within the bytes: not run, and why.
          {"methods_not_fitting", not_fitting},
          {"paired_vs_headwise", paired}};
}

void run_eval(const EvalArgs& args) {
  apply_logging(args.flags);
  const fs::path dir = io::resolve_model_dir(args.model);
  const arch::ModelSpec spec = arch::load_model_spec(dir);
  const std::vector<PolicyUnderTest> policies = read_policies(args, dir, spec);

  const auto baselines = split_list(args.baselines);
  for (const auto& b : baselines) {
    const auto& known = eval::baseline_names();
    if (std::find(known.begin(), known.end(), b) == known.end()) {
      throw_input_error(
          "--baselines {}: unknown baseline (have: {}){}", b, fmt::join(known, ", "),
          b == "pyramid" ? "; `pyramid` is now `pyramid-windows` (PyramidKV itself is `pyramidkv`)"
                         : "");
    }
  }
  // One sequence at a time: the figures are per sequence, at the policies' context and dtype.
  memory::MemoryOptions options = policies.front().policy.memory_options();
  options.batch = 1;
  const int64_t seq_len =
      args.seq_len == "context" ? options.context : parse_token_count(args.seq_len, "--seq-len");
  if (seq_len > options.context) {
    throw_input_error("--seq-len {} exceeds the policy's context of {} tokens", seq_len,
                      options.context);
  }
  for (const auto& p : policies)
    refuse_short_sequences(p.policy, seq_len, args.allow_short_seq_len);
  if (const auto warning = arch::check_context(spec, options.context, "the policy's context",
                                               (dir / "config.json").string())) {
    spdlog::warn("{}", *warning);
  }
  if (args.calib_samples <= 0)
    throw_input_error("--calib-samples must be positive, got {}", args.calib_samples);
  if (args.duo_steps <= 0)
    throw_input_error("--duo-steps must be positive, got {}", args.duo_steps);
  if (args.prefill_chunk <= 0)
    throw_input_error("--prefill-chunk must be positive, got {}", args.prefill_chunk);
  if (args.kl_positions <= 0)
    throw_input_error("--kl-positions must be positive, got {}", args.kl_positions);
  const arch::AttentionKernel attention_kernel = runtime_attention_kernel(args.runtime_attention);

  eval::TaskRequest request{split_list(args.tasks), args.samples, seq_len, args.seed};
  const auto samples = eval::make_eval_samples(dir, spec.vocab_size, request);
  if (!args.write_samples.empty()) {
    write_samples_jsonl(args.write_samples, samples);
    spdlog::info("eval: wrote {} samples to {}; nothing evaluated", samples.size(),
                 args.write_samples);
    return;
  }
  // Calibration samples for retrieval-score/duo/unconditioned come from another seed: never the
  // evaluated ones.
  eval::TaskRequest calib_request = request;
  calib_request.samples = args.calib_samples;
  calib_request.seed = args.seed + 0x9e3779b97f4a7c15ull;
  const auto calibration = eval::make_eval_samples(dir, spec.vocab_size, calib_request);
  std::vector<std::string> tasks;
  for (const auto& s : samples) {
    if (std::find(tasks.begin(), tasks.end(), s.task) == tasks.end()) tasks.push_back(s.task);
  }

  arch::ModelOptions model_options;
  model_options.device = args.device;
  if (args.jobs <= 0) throw_input_error("--jobs must be positive, got {}", args.jobs);
  if (args.threads_per_job < 0)
    throw_input_error("--threads-per-job must be positive, got {}", args.threads_per_job);
  // One model instance per job: a model streams its layers through state of its own.
  std::vector<std::unique_ptr<arch::DecoderModel>> models;
  for (int64_t j = 0; j < args.jobs; ++j) models.push_back(arch::load_model(dir, model_options));
  eval::RunOptions run{args.prefill_chunk, args.kl_positions, attention_kernel};
  // Full KV is the KL reference, so it runs first even when not reported; like the retrieval
  // scores and duo's gates it does not depend on the budget, so every policy shares it.
  eval::BaselineCache budget_free;
  const eval::BuildMethods build = [&](arch::DecoderModel& model, const eval::EmitMethod& emit) {
    const auto inputs_of = [&](const PolicyUnderTest& p) {
      eval::BaselineInputs in{
          p.policy, options, args.seed, {}, p.ablation ? &*p.ablation : nullptr};
      in.duo.steps = args.duo_steps;
      in.duo.attention_kernel = attention_kernel;
      return in;
    };
    // One method at a time, so the other jobs run each as soon as it exists; duo's gate training
    // (the long build at long contexts) goes last, once for every policy.
    for (const bool duo : {false, true}) {
      for (size_t i = 0; i < policies.size(); ++i) {
        const eval::BaselineInputs in = inputs_of(policies[i]);
        if (!duo) emit(i, 0, eval::build_methods(model, in, {}, calibration, &budget_free).front());
        for (size_t b = 0; b < baselines.size(); ++b) {
          if ((baselines[b] == "duo") != duo) continue;
          emit(i, b + 1,
               eval::build_methods(model, in, {baselines[b]}, calibration, &budget_free).back());
        }
      }
    }
  };
  eval::ScheduleOptions schedule;
  schedule.threads_per_worker = args.threads_per_job;
  const eval::ScheduledRuns runs =
      eval::run_scheduled(models, policies.size(), build, options, samples, run, schedule);
  spdlog::info("eval: {} decoder runs (full KV included), {} methods answered by an identical run",
               runs.runs_executed, runs.runs_reused);
  nlohmann::json evaluations = nlohmann::json::array();
  for (size_t i = 0; i < policies.size(); ++i) {
    const auto& methods = runs.methods[i];
    const auto& results = runs.results[i];
    warn_full_in_effect(methods, seq_len);
    if (args.flags.json) {
      evaluations.push_back(
          evaluation_json(policies[i], options, dir, spec, args, seq_len, tasks, methods, results));
    } else {
      if (policies.size() > 1) std::cout << "policy " << policies[i].path << "\n";
      print_table(methods, results, tasks);
    }
  }
  if (!args.flags.json) return;
  // One policy: its evaluation as the document (the format scripts read); several: in order.
  const nlohmann::json out =
      policies.size() == 1 ? evaluations.front() : nlohmann::json{{"evaluations", evaluations}};
  std::cout << out.dump(2) << "\n";
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
      add_runtime_attention_option(cmd, args.runtime_attention);
      add_common_flags(cmd, args.flags, /*with_json=*/true);
      cmd->callback([] { run_eval(args); });
    }};

}  // namespace
}  // namespace headwise::cli

// One evaluation, start to end (evaluation.hpp): the request checked, the samples drawn, every
// policy's methods built in report order and run on the scheduler's jobs, and the document.
#include "headwise/eval/evaluation.hpp"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <memory>

#include "headwise/arch/context_guard.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/eval/schedule.hpp"

namespace headwise::eval {
namespace {

// Calibration samples (retrieval-score, duo, unconditioned) come from a seed this far from the
// evaluated samples' own: never the evaluated ones.
constexpr uint64_t kCalibrationSeedOffset = 0x9e3779b97f4a7c15ull;

std::string state_dtype_label(const policy::Policy& p) {
  return p.state_dtype ? std::string(dtype_name(*p.state_dtype)) : std::string("native (absent)");
}

// Policies evaluated together share their samples and the full-KV reference, so they must be
// served the same way: only their budgets (and so their windows) may differ.
void check_same_serving_shape(const PolicyUnderTest& first, const PolicyUnderTest& other) {
  const policy::Policy& a = first.policy;
  const policy::Policy& p = other.policy;
  const auto differs = [&](const char* field, const std::string& theirs, const std::string& mine) {
    throw_field_error(
        "policy",
        " {}: {} is {}, but {} {} has {}; policies evaluated together must share the context, KV "
        "dtype, state dtype, block size and sink tokens",
        other.path, field, mine, field_ref("policy"), first.path, theirs);
  };
  if (p.context != a.context)
    differs("context", std::to_string(a.context), std::to_string(p.context));
  if (p.dtype != a.dtype)
    differs("dtype", std::string(dtype_name(a.dtype)), std::string(dtype_name(p.dtype)));
  if (p.state_dtype != a.state_dtype)
    differs("state_dtype", state_dtype_label(a), state_dtype_label(p));
  if (p.block_size != a.block_size)
    differs("block_size", std::to_string(a.block_size), std::to_string(p.block_size));
  if (p.sink_tokens != a.sink_tokens)
    differs("sink_tokens", std::to_string(a.sink_tokens), std::to_string(p.sink_tokens));
}

void check_policies(const std::vector<PolicyUnderTest>& policies) {
  if (policies.empty()) throw_field_error("policy", " is required");
  for (const PolicyUnderTest& p : policies) {
    check_same_serving_shape(policies.front(), p);
    if (p.unconditioned)
      check_unconditioned_ablation(p.policy, *p.unconditioned, p.unconditioned_path);
  }
}

void require_positive(const char* field, int64_t value) {
  if (value <= 0) throw_field_error(field, " must be positive, got {}", value);
}

// A head whose window is at least the sample length truncates nothing: on samples shorter than
// the policy's windows, the policy and every baseline built to its bytes at its context look
// like full KV in part, and the comparison measures nothing the deployment will see.
void refuse_short_sequences(const policy::Policy& p, int64_t seq_len, bool allowed) {
  const int64_t largest = largest_finite_window(p.head_windows());
  if (seq_len > largest) return;
  if (!allowed) {
    throw_field_error("seq_len",
                      " {} is not longer than the policy's largest finite window ({} tokens): "
                      "such windows truncate nothing there; evaluate at the policy's context (the "
                      "default) or pass {}",
                      seq_len, largest, field_ref("allow_short_seq_len"));
  }
  spdlog::warn(
      "--seq-len {} <= the policy's largest finite window ({}): heads with windows that long act "
      "as full KV on these samples, and baselines built to the policy's bytes at its context {} "
      "may too; the comparison does not show what the deployment will see",
      seq_len, largest, p.context);
}

// Methods whose every finite window covers the samples are full KV in effect: say so.
void warn_full_in_effect(const std::vector<MethodWindows>& methods, int64_t seq_len) {
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

// What every part of a run reads: the request checked, at the policies' shared serving shape.
struct Prepared {
  arch::ModelSpec spec;
  memory::MemoryOptions options;  // the policies', one sequence at a time
  int64_t seq_len = 0;
  TaskRequest tasks;
  std::vector<EvalSample> samples;
};

// Checks everything a run and --write-samples share, then draws the samples. A bad request
// fails here, before any model is loaded.
Prepared prepare(const EvaluationRequest& r) {
  Prepared out;
  out.spec = arch::load_model_spec(r.model_dir);
  check_policies(r.policies);
  for (const auto& b : r.baselines) require_known_baseline(b);
  // One sequence at a time: the figures are per sequence, at the policies' context and dtype.
  out.options = r.policies.front().policy.memory_options();
  out.options.batch = 1;
  out.seq_len = r.seq_len.value_or(out.options.context);
  if (out.seq_len > out.options.context) {
    throw_field_error("seq_len", " {} exceeds the policy's context of {} tokens", out.seq_len,
                      out.options.context);
  }
  for (const auto& p : r.policies)
    refuse_short_sequences(p.policy, out.seq_len, r.allow_short_seq_len);
  if (const auto warning =
          arch::check_context(out.spec, out.options.context, "the policy's context",
                              (r.model_dir / "config.json").string())) {
    spdlog::warn("{}", *warning);
  }
  require_positive("calib_samples", r.calib_samples);
  require_positive("duo_steps", r.duo_steps);
  require_positive("prefill_chunk", r.run.prefill_chunk);
  require_positive("kl_positions", r.run.kl_positions);
  out.tasks = TaskRequest{r.tasks, r.samples, out.seq_len, r.seed};
  out.samples = make_eval_samples(r.model_dir, out.spec.vocab_size, out.tasks);
  return out;
}

// The tasks the samples hold, in the order they first occur.
std::vector<std::string> tasks_of(const std::vector<EvalSample>& samples) {
  std::vector<std::string> tasks;
  for (const auto& s : samples) {
    if (std::find(tasks.begin(), tasks.end(), s.task) == tasks.end()) tasks.push_back(s.task);
  }
  return tasks;
}

BaselineInputs baseline_inputs(const EvaluationRequest& r, const PolicyUnderTest& p,
                               const memory::MemoryOptions& options) {
  BaselineInputs in{p.policy, options, r.seed, {}, p.unconditioned ? &*p.unconditioned : nullptr};
  in.duo.steps = r.duo_steps;
  in.duo.attention_kernel = r.run.attention_kernel;
  return in;
}

// Every policy's methods in report order: slot 0 the policy, slot b + 1 the b-th requested
// baseline. Built one at a time, so the other jobs run each as soon as it exists; duo's gate
// training (the long build at long contexts) goes last, once for every policy. Full KV is the
// KL reference, so the scheduler runs it first even when not reported; like the retrieval scores
// and duo's gates it does not depend on the budget, so every policy shares it (`budget_free`).
BuildMethods method_builder(const EvaluationRequest& r, const Prepared& prepared,
                            const std::vector<EvalSample>& calibration,
                            BaselineCache& budget_free) {
  return [&r, &prepared, &calibration, &budget_free](arch::DecoderModel& model,
                                                     const EmitMethod& emit) {
    for (const bool duo : {false, true}) {
      for (size_t i = 0; i < r.policies.size(); ++i) {
        const BaselineInputs in = baseline_inputs(r, r.policies[i], prepared.options);
        if (!duo) emit(i, 0, build_method(model, in, "headwise", calibration, &budget_free));
        for (size_t b = 0; b < r.baselines.size(); ++b) {
          if ((r.baselines[b] == "duo") != duo) continue;
          emit(i, b + 1, build_method(model, in, r.baselines[b], calibration, &budget_free));
        }
      }
    }
  };
}

// One policy's evaluation: its methods that ran (in report order, with how each chose), those
// that could not fit the bytes, and the policy against each method that ran on the same samples.
nlohmann::json evaluation_document(const EvaluationRequest& r, const PolicyUnderTest& p,
                                   const Prepared& prepared, const std::vector<std::string>& tasks,
                                   const std::vector<MethodWindows>& methods,
                                   const std::vector<MethodResult>& results) {
  const memory::MemoryOptions& options = prepared.options;
  nlohmann::json methods_json = nlohmann::json::array();
  nlohmann::json not_fitting = nlohmann::json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    if (methods[i].does_not_fit) {
      not_fitting.push_back({{"name", methods[i].name}, {"reason", *methods[i].does_not_fit}});
      continue;
    }
    nlohmann::json m = to_json(results[i], prepared.spec);
    nlohmann::json details = methods[i].details;
    details.update(results[i].runtime_details);
    if (!details.empty()) m["details"] = details;
    methods_json.push_back(std::move(m));
  }
  nlohmann::json paired = nlohmann::json::object();
  const auto policy_result = std::find_if(
      results.begin(), results.end(), [](const auto& result) { return result.name == "headwise"; });
  if (policy_result != results.end()) {
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].name != "headwise" && !methods[i].does_not_fit)
        paired[results[i].name] = to_json(paired_comparison(*policy_result, results[i]));
    }
  }
  return {
      {"model", r.model_dir.string()},
      {"policy", p.path},
      {"context", options.context},
      {"batch", options.batch},
      {"kv_dtype", dtype_name(options.kv_dtype)},
      {"state_dtype", options.state_dtype
                          ? nlohmann::json(std::string(dtype_name(*options.state_dtype)))
                          : nlohmann::json("native")},
      {"seq_len", prepared.seq_len},
      {"samples_per_task", r.samples},
      {"seed", r.seed},
      {"tasks", tasks},
      {"policy_global_kv_bytes", global_kv_bytes(prepared.spec, p.policy.head_windows(), options)},
      {"one_block_per_head_bytes", one_block_per_head(prepared.spec, options)},
      {"methods", methods_json},
      // Requested baselines with no configuration within the bytes: not run, and why.
      {"methods_not_fitting", not_fitting},
      {"paired_vs_headwise", paired}};
}

// Appends one policy's methods' decoded answers (Evaluation::tokens_jsonl) to `out`, in report
// order and then sample order. Methods that did not fit ran nothing and write nothing.
void append_tokens(std::string& out, const PolicyUnderTest& p,
                   const std::vector<EvalSample>& samples,
                   const std::vector<MethodWindows>& methods,
                   const std::vector<MethodResult>& results) {
  // Each sample's place within its task: the key tools/peers_eval.py writes its answers under.
  std::vector<int64_t> index_in_task;
  std::vector<std::string> sha;
  std::map<std::string, int64_t> seen;
  for (const auto& s : samples) {
    index_in_task.push_back(seen[s.task]++);
    sha.push_back(prompt_sha256(s.prompt));
  }
  for (size_t m = 0; m < results.size(); ++m) {
    if (methods[m].does_not_fit) continue;
    const MethodResult& r = results[m];
    HEADWISE_CHECK(r.answer_per_sample.size() == samples.size() &&
                       r.correct_per_sample.size() == samples.size(),
                   "{}: {} answers for {} samples", r.name, r.answer_per_sample.size(),
                   samples.size());
    for (size_t n = 0; n < samples.size(); ++n) {
      out += nlohmann::json{{"policy", p.path},
                            {"method", r.name},
                            {"task", samples[n].task},
                            {"index", index_in_task[n]},
                            {"sample", n},
                            {"prompt_tokens", samples[n].prompt.size()},
                            {"prompt_sha256", sha[n]},
                            {"generated", r.answer_per_sample[n]},
                            {"right", r.correct_per_sample[n] != 0}}
                 .dump();
      out += "\n";
    }
  }
}

}  // namespace

std::string prompt_sha256(const std::vector<int64_t>& prompt) {
  return sha256_hex(fmt::format("{}", fmt::join(prompt, ",")));
}

std::vector<EvalSample> evaluation_samples(const EvaluationRequest& request) {
  return prepare(request).samples;
}

std::string samples_jsonl(const std::vector<EvalSample>& samples) {
  std::string out;
  for (const auto& s : samples) {
    out += nlohmann::json{{"task", s.task},
                          {"prompt", s.prompt},
                          {"answer", s.answer},
                          {"answer_source", s.answer_source}}
               .dump();
    out += "\n";
  }
  return out;
}

Evaluation evaluate(const EvaluationRequest& r) {
  const Prepared prepared = prepare(r);
  TaskRequest calib_request = prepared.tasks;
  calib_request.samples = r.calib_samples;
  calib_request.seed = r.seed + kCalibrationSeedOffset;
  const auto calibration = make_eval_samples(r.model_dir, prepared.spec.vocab_size, calib_request);
  const std::vector<std::string> tasks = tasks_of(prepared.samples);

  require_positive("jobs", r.jobs);
  if (r.threads_per_job < 0)
    throw_field_error("threads_per_job", " must be positive, got {}", r.threads_per_job);
  arch::ModelOptions model_options;
  model_options.device = r.device;
  // One model instance per job: a model streams its layers through state of its own.
  std::vector<std::unique_ptr<arch::DecoderModel>> models;
  for (int64_t j = 0; j < r.jobs; ++j)
    models.push_back(arch::load_model(r.model_dir, model_options));
  BaselineCache budget_free;
  ScheduleOptions schedule;
  schedule.threads_per_worker = r.threads_per_job;
  const ScheduledRuns runs = run_scheduled(models, r.policies.size(),
                                           method_builder(r, prepared, calibration, budget_free),
                                           prepared.options, prepared.samples, r.run, schedule);
  spdlog::info("eval: {} decoder runs (full KV included), {} methods answered by an identical run",
               runs.runs_executed, runs.runs_reused);
  Evaluation out;
  nlohmann::json evaluations = nlohmann::json::array();
  for (size_t i = 0; i < r.policies.size(); ++i) {
    warn_full_in_effect(runs.methods[i], prepared.seq_len);
    evaluations.push_back(
        evaluation_document(r, r.policies[i], prepared, tasks, runs.methods[i], runs.results[i]));
    append_tokens(out.tokens_jsonl, r.policies[i], prepared.samples, runs.methods[i],
                  runs.results[i]);
  }
  // One policy: its evaluation is the document (the format scripts read); several: in order.
  out.document =
      evaluations.size() == 1 ? evaluations.front() : nlohmann::json{{"evaluations", evaluations}};
  return out;
}

nlohmann::json run_evaluation(const EvaluationRequest& r) {
  return evaluate(r).document;
}

}  // namespace headwise::eval

#pragma once
// `eval`: the policy and its baselines run through the runtime decoder (windows applied
// physically), each at the same global-KV bytes as the policy, on the same samples.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/duo_attention.hpp"
#include "headwise/eval/tasks.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/runtime/decoder.hpp"
#include "headwise/runtime/eviction_cache.hpp"

namespace headwise::eval {

// Method names, in report order; "headwise" is the policy itself.
const std::vector<std::string>& method_names();
const std::vector<std::string>& baseline_names();  // method_names() without "headwise"

struct MethodWindows {
  std::string name;
  memory::HeadWindows windows;
  nlohmann::json details =
      nlohmann::json::object();  // how a baseline chose (scores, gates, training)
  // Set for the online eviction methods (h2o, snapkv, adakv, pyramidkv and their variants): every
  // global KV head gets the slots `windows` give it (the method's own allocation, or the policy's
  // for the *-headwise-slots ablations), and the method chooses which tokens fill them.
  std::optional<runtime::EvictionOptions> eviction = std::nullopt;
  // Global layers whose heads select tokens: their bookkeeping (positions, scores, regions) is
  // part of the method's bytes, estimated and measured, for the policy and every baseline alike.
  std::set<int64_t> selecting_layers = {};
  // Sink tokens of every windowed head when the method keeps its own (streamingllm: 4, duo's
  // streaming heads: 128); unset: the policy's.
  std::optional<int64_t> sink_tokens = std::nullopt;
  // Set when the method has no configuration within the bytes (its smallest one is larger, e.g.
  // an eviction method's one block per head plus its bookkeeping): why, with both byte counts.
  // Such a method is not run; eval reports it apart (`methods_not_fitting`), the others still run.
  std::optional<std::string> does_not_fit = std::nullopt;
};

// The memory options a method runs at: the policy's, with the method's own sink tokens.
memory::MemoryOptions method_options(const MethodWindows& method,
                                     const memory::MemoryOptions& policy_options);

struct BaselineInputs {
  const policy::Policy& policy;
  memory::MemoryOptions options;  // the policy's, as eval runs them
  uint64_t seed = 0;              // the random baseline's
  DuoTrainingOptions duo;         // the duo baseline's gate training and streaming heads' shape
  // The policy's own calibration rerun with --no-conditioning (same data, measure, ladder and
  // budget; checked by check_unconditioned_ablation). When absent, `unconditioned` is calibrated
  // inside eval on the eval tasks' calibration samples, which also changes the data.
  const policy::Policy* unconditioned_policy = nullptr;
};

// A policy as eval runs it: its windows, and when some heads select tokens (kv_head_rules), the
// eviction cache with H2O for those heads and the window for the rest.
MethodWindows policy_method(const std::string& name, const policy::Policy& policy);

// Refuses (InputError naming `where`) an --unconditioned-policy that is not `policy`'s
// calibration with only the conditioning removed: method `unconditioned`, and the same ladder,
// serving shape, budget, dataset (sha256), samples, sequence length, seed, measure and heads.
void check_unconditioned_ablation(const policy::Policy& policy, const policy::Policy& ablation,
                                  const std::string& where);

// The retrieval score (the HeadKV / RazorAttention family), measured without training: the
// attention mass each KV head's query heads put on the needle (the answer's occurrence in the
// prompt) while producing the answer, with full KV, averaged over samples. Samples whose answer
// never occurs in the prompt do not count.
HeadScores retrieval_scores(arch::DecoderModel& model, const std::vector<EvalSample>& samples);

// What a baseline learns from the calibration samples without looking at the budget: the
// retrieval scores, and duo's gates per streaming window (and sinks). Evaluating several
// policies of one model on the same samples (a rate-quality curve) computes each once; duo's
// gate training is the most expensive step of an eval at long contexts.
struct BaselineCache {
  std::optional<HeadScores> retrieval_scores;
  std::map<std::pair<int64_t, int64_t>, DuoGates>
      duo_gates;  // (recent window, sink tokens) → gates
};

// The windows of method `name`: "headwise" (the policy itself) or one of baseline_names(); a
// baseline that cannot be built at the policy's bytes comes back with `does_not_fit` set.
// `calibration` samples (drawn apart from the evaluated ones) give retrieval-score its scores, duo
// its gate training and unconditioned its curves (prompt + answer, cut to the shortest so
// SeqCalib gets equal lengths). With `cache`, budget-free work found there is reused and new work
// is stored there; the caller must pass the same model and calibration samples every time.
MethodWindows build_method(arch::DecoderModel& model, const BaselineInputs& inputs,
                           const std::string& name, const std::vector<EvalSample>& calibration,
                           BaselineCache* cache = nullptr);

// InputError naming --baselines when `name` is not one of baseline_names().
void require_known_baseline(const std::string& name);

struct RunOptions {
  int64_t prefill_chunk = 256;
  int64_t kl_positions = 512;  // last prompt positions compared with full KV (bounds memory)
  arch::AttentionKernel attention_kernel = arch::AttentionKernel::kFused;
};

struct MethodResult {
  std::string name;
  memory::HeadWindows windows;
  int64_t global_kv_bytes = 0;
  int64_t cache_bytes_estimated = 0;       // memory::estimate at the run's options
  int64_t cache_bytes_measured = 0;        // storage the decoder's cache holds after the run
  std::map<std::string, double> accuracy;  // per task
  std::map<std::string, std::pair<int64_t, int64_t>> correct;  // per task: (right, total)
  std::vector<uint8_t> correct_per_sample;  // 1 where the answer was exact, in sample order
  std::vector<std::vector<int64_t>>
      answer_per_sample;               // the answer the harness decoded (greedy_answer)
  std::vector<double> kl_per_sample;   // mean KL per compared position, one per sample
  std::vector<double> nll_per_sample;  // mean NLL per prompt token, one per sample
  double kl_vs_full = 0.0;             // mean KL(full || method) per compared position
  double perplexity = 0.0;             // on the prompts' next tokens
  double prefill_tokens_per_s = 0.0;
  double decode_tokens_per_s = 0.0;
  std::vector<at::Tensor> logprobs;  // per sample [kl positions, vocab], kept for the full method
  // Measured by the run, merged into the method's JSON details: for eviction methods the
  // auxiliary bytes (not KV) and the most prompt K/V ever staged (SnapKV/AdaKV's prefill peak).
  nlohmann::json runtime_details = nlohmann::json::object();
};

// The answer a greedy harness decodes after the prompt (`prompt_logits`: the prefill's logits
// [1, prompt, vocab]): each generated token is the argmax of the logits so far; a given token is
// fed as it is, a copied one repeats the model's own earlier answer token
// (EvalSample::answer_source).
std::vector<int64_t> greedy_answer(runtime::Decoder& decoder, const at::Tensor& prompt_logits,
                                   const EvalSample& sample);

// Runs every sample. `reference`: the full method's result (its logprobs), or null when this
// is the full method itself (KL 0 by definition, and its logprobs are kept).
MethodResult run_method(arch::DecoderModel& model, const MethodWindows& method,
                        const memory::MemoryOptions& options,
                        const std::vector<EvalSample>& samples, const RunOptions& run,
                        const MethodResult* reference);

nlohmann::json to_json(const MethodResult& result, const arch::ModelSpec& spec);

// The 95% Wilson score interval of `right` successes in `total` trials (z = 1.96): unlike the
// normal approximation it stays inside [0, 1] and is honest at 0 or `total` successes.
std::pair<double, double> wilson_interval(int64_t right, int64_t total);

// Mean and the half-width of its 95% normal interval (1.96 standard errors), over samples.
std::pair<double, double> mean_and_ci95(const std::vector<double>& values);

// Two methods on the *same* samples: paired tests see differences that two independent
// intervals hide (each sample's difficulty cancels).
struct PairedComparison {
  int64_t samples = 0;
  int64_t only_a = 0;  // samples a answers and b does not
  int64_t only_b = 0;
  double accuracy_difference = 0;                      // accuracy(a) - accuracy(b)
  std::pair<double, double> accuracy_difference_ci95;  // Wald interval of a paired difference
  double mcnemar_p = 1.0;    // exact two-sided McNemar (binomial on the discordant samples)
  double kl_difference = 0;  // mean over samples of kl(a) - kl(b)
  double kl_difference_ci95_half_width = 0;
};
PairedComparison paired_comparison(const MethodResult& a, const MethodResult& b);
nlohmann::json to_json(const PairedComparison& c);

// Largest finite window of any head (0 when every head is full).
int64_t largest_finite_window(const memory::HeadWindows& windows);

}  // namespace headwise::eval

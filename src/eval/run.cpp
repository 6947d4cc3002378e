// One method over every sample through the runtime decoder: accuracy, KL vs full, perplexity,
// throughput, and the cache bytes (measured from the decoder's storage, and estimated).
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "headwise/core/clock.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"
#include "headwise/core/window_json.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/runtime/decoder.hpp"

namespace headwise::eval {
namespace {

// {"<layer id>": [window per KV head]}: mem-estimate's kv_head_windows, keyed by layer.
nlohmann::json layer_windows_json(const memory::HeadWindows& windows) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [layer, heads] : windows) out[std::to_string(layer)] = windows_json(heads);
  return out;
}

}  // namespace

// The last token is not fed back (nothing reads its logits), as in Decoder::generate.
std::vector<int64_t> greedy_answer(runtime::Decoder& decoder, const at::Tensor& prompt_logits,
                                   const EvalSample& s) {
  const auto n = static_cast<int64_t>(s.answer.size());
  if (s.answer_source.empty()) {
    const at::Tensor generated = decoder.generate(n).view({-1}).contiguous();
    return {generated.data_ptr<int64_t>(), generated.data_ptr<int64_t>() + n};
  }
  HEADWISE_CHECK(static_cast<int64_t>(s.answer_source.size()) == n,
                 "{} answer sources for {} answer tokens", s.answer_source.size(), n);
  at::Tensor logits = prompt_logits.select(1, -1);  // [1, vocab]
  std::vector<int64_t> produced;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t source = s.answer_source[static_cast<size_t>(i)];
    HEADWISE_CHECK(
        source == kGeneratedToken || source == kGivenToken || (source >= 0 && source < i),
        "answer token {} copies index {}", i, source);
    const int64_t token = source == kGeneratedToken ? logits.argmax(-1).item<int64_t>()
                          : source == kGivenToken   ? s.answer[static_cast<size_t>(i)]
                                                    : produced[static_cast<size_t>(source)];
    produced.push_back(token);
    if (i + 1 < n)
      logits = decoder.decode_step(at::full({1}, token, logits.options().dtype(at::kLong)));
  }
  return produced;
}

MethodResult run_method(arch::DecoderModel& model, const MethodWindows& method,
                        const memory::MemoryOptions& policy_options,
                        const std::vector<EvalSample>& samples, const RunOptions& run,
                        const MethodResult* reference) {
  const memory::MemoryOptions options = method_options(method, policy_options);
  c10::InferenceMode inference;
  HEADWISE_CHECK(options.batch == 1, "eval runs one sequence at a time, got batch {}",
                 options.batch);
  HEADWISE_CHECK(reference == nullptr || reference->logprobs.size() == samples.size(),
                 "reference has {} samples, not {}", reference ? reference->logprobs.size() : 0,
                 samples.size());
  MethodResult r;
  r.name = method.name;
  r.windows = method.windows;
  r.global_kv_bytes = global_kv_bytes(model.spec(), method.windows, options);
  r.cache_bytes_estimated =
      memory::estimate(model.spec(), method.windows, options, method.selecting_layers).total_bytes;
  runtime::Decoder decoder =
      method.eviction ? runtime::Decoder(model, method.windows, options, *method.eviction)
                      : runtime::Decoder(model, method.windows, options);
  decoder.set_attention_kernel(run.attention_kernel);
  const auto long_opts = at::TensorOptions().dtype(at::kLong);
  std::map<std::string, std::pair<int64_t, int64_t>> correct;  // task → (right, total)
  double prefill_s = 0, decode_s = 0, nll = 0, kl = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0, nll_count = 0, kl_count = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    const auto prompt_len = static_cast<int64_t>(s.prompt.size());
    decoder.reset();
    auto start = std::chrono::steady_clock::now();
    const at::Tensor logits =
        decoder.prefill(at::tensor(s.prompt, long_opts).view({1, -1}), run.prefill_chunk);
    prefill_s += seconds_since(start);
    prefill_tokens += prompt_len;
    start = std::chrono::steady_clock::now();
    std::vector<int64_t> answer = greedy_answer(decoder, logits, s);
    decode_s += seconds_since(start);
    decode_tokens += static_cast<int64_t>(s.answer.size());

    const at::Tensor logp = at::log_softmax(logits.select(0, 0), -1).cpu();  // [P, V]
    if (prompt_len > 1) {
      const at::Tensor next =
          at::tensor(std::vector<int64_t>(s.prompt.begin() + 1, s.prompt.end()), long_opts);
      // Sums whose bits do not depend on the thread count: `--jobs N` runs each job on fewer
      // threads.
      const double sample_nll =
          -thread_count_independent_sum(
               logp.slice(0, 0, prompt_len - 1).gather(1, next.view({-1, 1})), at::kDouble)
               .item<double>();
      nll += sample_nll;
      nll_count += prompt_len - 1;
      r.nll_per_sample.push_back(sample_nll / static_cast<double>(prompt_len - 1));
    }
    const int64_t k = std::min(run.kl_positions, prompt_len);
    const at::Tensor tail = logp.slice(0, prompt_len - k, prompt_len);
    if (reference == nullptr) {
      r.logprobs.push_back(tail.clone());
    } else {
      const at::Tensor& ref = reference->logprobs[i];
      HEADWISE_CHECK(ref.sizes() == tail.sizes(), "reference logprobs {} vs {}",
                     arch::shape_string(ref.sizes()), arch::shape_string(tail.sizes()));
      const double sample_kl =
          thread_count_independent_sum(ref.exp() * (ref - tail), at::kDouble).item<double>();
      kl += sample_kl;
      kl_count += k;
      r.kl_per_sample.push_back(sample_kl / static_cast<double>(k));
    }
    auto& [right, total] = correct[s.task];
    const bool exact = answer == s.answer;
    r.answer_per_sample.push_back(std::move(answer));
    right += exact ? 1 : 0;
    ++total;
    r.correct_per_sample.push_back(exact ? 1 : 0);
  }
  // A method that selects tokens holds its bookkeeping as long as its K/V: part of its bytes.
  r.cache_bytes_measured =
      decoder.cache_bytes() + (method.eviction ? decoder.bookkeeping_bytes() : 0);
  if (const runtime::EvictionCache* ev = decoder.eviction_cache()) {
    r.runtime_details = {{"auxiliary_bytes_measured", ev->auxiliary_bytes()},
                         {"prefill_staged_peak_bytes_measured", ev->peak_staged_bytes()}};
  }
  r.correct = correct;
  for (const auto& [task, counts] : correct)
    r.accuracy[task] = static_cast<double>(counts.first) / static_cast<double>(counts.second);
  r.kl_vs_full = kl_count > 0 ? kl / static_cast<double>(kl_count) : 0.0;
  r.perplexity = nll_count > 0 ? std::exp(nll / static_cast<double>(nll_count)) : 0.0;
  r.prefill_tokens_per_s = prefill_s > 0 ? static_cast<double>(prefill_tokens) / prefill_s : 0.0;
  r.decode_tokens_per_s = decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0.0;
  return r;
}

namespace {
constexpr double kZ95 = 1.959963984540054;  // two-sided 95% quantile of the standard normal
}  // namespace

std::pair<double, double> wilson_interval(int64_t right, int64_t total) {
  if (total <= 0) return {0.0, 1.0};
  constexpr double z = kZ95;
  const double n = static_cast<double>(total), p = static_cast<double>(right) / n, z2 = z * z;
  const double centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

std::pair<double, double> mean_and_ci95(const std::vector<double>& values) {
  if (values.empty()) return {0.0, 0.0};
  const double n = static_cast<double>(values.size());
  double mean = 0;
  for (double v : values) mean += v;
  mean /= n;
  if (values.size() < 2) return {mean, 0.0};
  double ss = 0;
  for (double v : values) ss += (v - mean) * (v - mean);
  return {mean, kZ95 * std::sqrt(ss / (n - 1) / n)};
}

namespace {

// P(X <= k) for X ~ Binomial(n, 1/2), in log space (n up to many thousands).
double binomial_half_cdf(int64_t k, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i <= k; ++i) {
    const double log_term =
        std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(i) + 1) -
        std::lgamma(static_cast<double>(n - i) + 1) - static_cast<double>(n) * std::log(2.0);
    total += std::exp(log_term);
  }
  return total;
}

}  // namespace

PairedComparison paired_comparison(const MethodResult& a, const MethodResult& b) {
  HEADWISE_CHECK(a.correct_per_sample.size() == b.correct_per_sample.size(),
                 "paired comparison of {} and {} samples", a.correct_per_sample.size(),
                 b.correct_per_sample.size());
  PairedComparison c;
  c.samples = static_cast<int64_t>(a.correct_per_sample.size());
  for (size_t i = 0; i < a.correct_per_sample.size(); ++i) {
    c.only_a += a.correct_per_sample[i] && !b.correct_per_sample[i];
    c.only_b += b.correct_per_sample[i] && !a.correct_per_sample[i];
  }
  if (c.samples > 0) {
    const auto n = static_cast<double>(c.samples);
    const auto diff = static_cast<double>(c.only_a - c.only_b);
    c.accuracy_difference = diff / n;
    const double half =
        kZ95 *
        std::sqrt(std::max(0.0, static_cast<double>(c.only_a + c.only_b) - diff * diff / n)) / n;
    c.accuracy_difference_ci95 = {c.accuracy_difference - half, c.accuracy_difference + half};
  }
  const int64_t discordant = c.only_a + c.only_b;
  if (discordant > 0)
    c.mcnemar_p = std::min(1.0, 2.0 * binomial_half_cdf(std::min(c.only_a, c.only_b), discordant));
  if (a.kl_per_sample.size() == b.kl_per_sample.size() && !a.kl_per_sample.empty()) {
    std::vector<double> d;
    for (size_t i = 0; i < a.kl_per_sample.size(); ++i)
      d.push_back(a.kl_per_sample[i] - b.kl_per_sample[i]);
    std::tie(c.kl_difference, c.kl_difference_ci95_half_width) = mean_and_ci95(d);
  }
  return c;
}

nlohmann::json to_json(const PairedComparison& c) {
  return {{"samples", c.samples},
          {"right_only_first", c.only_a},
          {"right_only_second", c.only_b},
          {"accuracy_difference", c.accuracy_difference},
          {"accuracy_difference_ci95",
           {c.accuracy_difference_ci95.first, c.accuracy_difference_ci95.second}},
          {"mcnemar_p", c.mcnemar_p},
          {"kl_difference", c.kl_difference},
          {"kl_difference_ci95_half_width", c.kl_difference_ci95_half_width}};
}

int64_t largest_finite_window(const memory::HeadWindows& windows) {
  int64_t largest = 0;
  for (const auto& [layer, heads] : windows) {
    for (int64_t w : heads) {
      if (w != kFullWindow) largest = std::max(largest, w);
    }
  }
  return largest;
}

nlohmann::json to_json(const MethodResult& r, const arch::ModelSpec& spec) {
  nlohmann::json intervals = nlohmann::json::object(), counts = nlohmann::json::object();
  for (const auto& [task, c] : r.correct) {
    const auto [lo, hi] = wilson_interval(c.first, c.second);
    intervals[task] = {lo, hi};
    counts[task] = {{"right", c.first}, {"total", c.second}};
  }
  const auto [kl_mean, kl_half] = mean_and_ci95(r.kl_per_sample);
  const auto [nll_mean, nll_half] = mean_and_ci95(r.nll_per_sample);
  return {{"name", r.name},
          {"tasks_ci95", intervals},
          {"tasks_counts", counts},
          {"kl_vs_full_ci95_half_width", kl_half},
          {"kl_vs_full_per_sample_mean", kl_mean},
          {"perplexity_ci95",
           r.nll_per_sample.empty()
               ? nlohmann::json(nullptr)
               : nlohmann::json{std::exp(nll_mean - nll_half), std::exp(nll_mean + nll_half)}},
          {"cache_bytes_estimated", r.cache_bytes_estimated},
          {"cache_bytes_measured", r.cache_bytes_measured},
          {"global_kv_bytes", r.global_kv_bytes},
          {"tasks", r.accuracy},
          {"kl_vs_full", r.kl_vs_full},
          {"perplexity", r.perplexity},
          {"prefill_tokens_per_s", r.prefill_tokens_per_s},
          {"decode_tokens_per_s", r.decode_tokens_per_s},
          {"windows", layer_windows_json(r.windows)}};
}

}  // namespace headwise::eval

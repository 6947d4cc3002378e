// The methods eval compares: the policy, full KV, and baselines at the policy's bytes.
#include <c10/core/InferenceMode.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "headwise/arch/attention.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/core/error.hpp"
#include "headwise/eval/duo_attention.hpp"
#include "headwise/eval/eval.hpp"
#include "unconditioned.hpp"

namespace headwise::eval {
namespace {

// Exact attention that also measures, at global layers, the attention mass of the answer-
// producing queries on the needle keys, per KV head (its query heads averaged).
class RetrievalScoreCore final : public arch::AttentionCore {
 public:
  RetrievalScoreCore(at::Tensor rows, at::Tensor needles, int64_t chunk)
      : rows_(std::move(rows)), needles_(std::move(needles)), exact_(chunk) {}

  at::Tensor attend(const arch::AttentionInputs& in) override {
    if (in.sliding_window == 0) measure(in);
    return exact_.attend(in);
  }
  std::map<int64_t, std::vector<double>> mass;

 private:
  void measure(const arch::AttentionInputs& in) {
    const int64_t batch = in.q.size(0), num_heads = in.q.size(1), head_dim = in.q.size(3),
                  keys = in.k.size(2);
    const int64_t num_kv = in.k.size(1), group = num_heads / num_kv, rows = rows_.size(0);
    const at::Tensor q = in.q.index_select(2, rows_).view({batch, num_kv, group, rows, head_dim});
    at::Tensor scores =
        at::matmul(q, in.k.unsqueeze(2).transpose(-1, -2)) * in.scaling;  // [B, nkv, g, r, T]
    if (in.logit_softcap > 0) scores = at::tanh(scores / in.logit_softcap) * in.logit_softcap;
    const at::Tensor visible = arch::visible_keys(
        rows_ + in.position_offset, at::arange(keys, rows_.options()), kFullWindow, 0);
    const at::Tensor sink =
        in.sink_logits.defined() ? in.sink_logits.view({1, num_kv, group, 1, 1}) : at::Tensor();
    const at::Tensor probs = arch::softmax_with_sink_logit(
        scores.to(at::kFloat)
            .masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity()),
        sink);
    const at::Tensor per_head =
        probs.index_select(-1, needles_).sum(-1).mean({0, 2, 3}).to(at::kDouble).cpu();
    auto& out = mass[in.layer_id];
    out.assign(per_head.data_ptr<double>(), per_head.data_ptr<double>() + num_kv);
  }

  at::Tensor rows_, needles_;
  arch::ExactAttentionCore exact_;
};

// The runs of consecutive answer indices the model generates: one per hop of a multi-hop answer.
std::vector<std::vector<int64_t>> generated_runs(const EvalSample& s) {
  std::vector<std::vector<int64_t>> runs;
  for (int64_t i : generated_answer_indices(s)) {
    if (runs.empty() || runs.back().back() + 1 != i) runs.emplace_back();
    runs.back().push_back(s.answer[static_cast<size_t>(i)]);
  }
  return runs;
}

// Where the needles sit: the last occurrence in the prompt of each generated run of the answer
// (one needle per hop), else every prompt position holding one of the generated answer tokens
// (text tasks may tokenize the answer differently).
std::vector<int64_t> needle_positions(const EvalSample& s) {
  const auto runs = generated_runs(s);
  std::vector<int64_t> out;
  for (const auto& run : runs) {
    const auto it = std::find_end(s.prompt.begin(), s.prompt.end(), run.begin(), run.end());
    if (it == s.prompt.end()) {
      out.clear();
      break;
    }
    for (size_t i = 0; i < run.size(); ++i)
      out.push_back(static_cast<int64_t>(it - s.prompt.begin() + static_cast<std::ptrdiff_t>(i)));
  }
  if (!out.empty()) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  for (size_t p = 0; p + 1 < s.prompt.size(); ++p) {
    if (std::any_of(runs.begin(), runs.end(), [&](const auto& run) {
          return std::find(run.begin(), run.end(), s.prompt[p]) != run.end();
        })) {
      out.push_back(static_cast<int64_t>(p));
    }
  }
  return out;
}

// {"layer": [score per KV head]} for the eval JSON.
nlohmann::json scores_json(const HeadScores& scores) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [layer, heads] : scores) out[std::to_string(layer)] = heads;
  return out;
}

constexpr int64_t kStreamingSinks = 4;  // StreamingLLM's attention sinks

// What every baseline may spend on global layers: the policy's global KV plus its selection
// bookkeeping (an h2o head's slots are paid for with it; a window needs none). A baseline that
// selects tokens pays its own bookkeeping from the same bytes.
int64_t budget_of(const arch::ModelSpec& spec, const BaselineInputs& in) {
  const auto windows = in.policy.head_windows();
  const int64_t bookkeeping =
      memory::estimate(spec, windows, in.options, in.policy.selecting_layers())
          .components.selection_state_bytes;
  return global_kv_bytes(spec, windows, in.options) + bookkeeping;
}

// How an eviction method divides the bytes among heads.
enum class Allocation {
  kUniform,      // one capacity per head (H2O, SnapKV, AdaKV as published)
  kPyramid,      // PyramidKV's per-layer pyramid, SnapKV's selection in each layer
  kPolicySlots,  // the policy's own slots per head (the *-headwise-slots ablations)
};

struct EvictionBaseline {
  runtime::EvictionOptions options;
  Allocation allocation = Allocation::kUniform;
};

constexpr const char* kPolicySlotsSuffix = "-headwise-slots";
constexpr double kPyramidBeta = 20;  // PyramidKV's default steepness

// The eviction baselines by name: h2o, snapkv, adakv, snapkv-chunked, adakv-chunked, pyramidkv,
// pyramidkv-chunked at their own allocation, and each of the first five on the policy's slots
// with "-headwise-slots" appended.
std::optional<EvictionBaseline> eviction_baseline(const std::string& name) {
  using runtime::EvictionMethod;
  using runtime::EvictionPrefill;
  for (EvictionPrefill prefill : {EvictionPrefill::kWholePrompt, EvictionPrefill::kEachChunk}) {
    runtime::EvictionOptions o;
    o.method = EvictionMethod::kSnapKV;
    o.prefill = prefill;
    if (name ==
        "pyramidkv" + std::string(prefill == EvictionPrefill::kEachChunk ? "-chunked" : "")) {
      return EvictionBaseline{o, Allocation::kPyramid};
    }
    for (EvictionMethod method :
         {EvictionMethod::kSnapKV, EvictionMethod::kH2O, EvictionMethod::kAdaKV}) {
      o.method = method;
      const std::string base = runtime::eviction_name(o);
      if (name == base) return EvictionBaseline{o, Allocation::kUniform};
      if (name == base + kPolicySlotsSuffix) return EvictionBaseline{o, Allocation::kPolicySlots};
    }
  }
  return std::nullopt;
}

// What the eviction baseline did, with its parameters, for the eval JSON.
nlohmann::json eviction_details(const std::string& name, const EvictionBaseline& e) {
  const runtime::EvictionOptions& o = e.options;
  nlohmann::json d = {
      {"method", name},
      {"rule_of", runtime::eviction_name(o)},
      {"ties", "keep the more recent position"},
      {"bookkeeping",
       "positions (int64) and keep scores (float32) per slot plus the region table of every global "
       "layer: part of the method's cache bytes, estimated and measured "
       "(auxiliary_bytes_measured)"}};
  switch (e.allocation) {
    case Allocation::kUniform:
      d["allocation"] =
          "as published: one capacity round_up(min(window + sink_tokens, context), block_size) for "
          "every "
          "global KV head, the largest whose K/V plus bookkeeping fit the policy's cache bytes";
      break;
    case Allocation::kPyramid:
      d["allocation"] = fmt::format(
          "PyramidKV: global layer j of G keeps window + round(max - j (max - min) / (G - 1)) "
          "tokens per head, min = P / "
          "{}, max = 2P - min, P the largest mean prefix budget whose K/V plus bookkeeping fit the "
          "policy's cache bytes",
          kPyramidBeta);
      break;
    case Allocation::kPolicySlots:
      d["allocation"] =
          "ablation: the policy's own slots per KV head (its K/V bytes to the byte), so its "
          "bookkeeping "
          "comes on top of the policy's bytes";
      break;
  }
  if (o.method == runtime::EvictionMethod::kH2O) {
    d["rule"] =
        "heavy hitters by attention accumulated over every query so far (summed over the KV head's "
        "query "
        "heads) plus the most recent tokens, half the capacity each; evicts during chunked prefill "
        "and decode";
    d["prefill"] =
        "bounded: the cache never exceeds the capacity (a prefill chunk's own keys are "
        "activations)";
    return d;
  }
  d["observation_window"] = o.observation_window;
  d["pooling"] = runtime::pooling_name(o.pooling);
  d["pooling_kernel"] = o.pooling_kernel;
  if (o.prefill == runtime::EvictionPrefill::kEachChunk) {
    d["prefill"] =
        "chunked: the rule runs at the end of every prefill chunk over the held keys plus the "
        "chunk's, the "
        "chunk's last queries observing; the cache never exceeds the capacity (a chunk's own keys "
        "are "
        "activations, as for every method), and the question at the prompt's end chooses only "
        "among what "
        "earlier chunks kept";
    d["prompt_logits"] =
        "a chunk's queries attend over the held keys plus the chunk's own, as decoded";
  } else {
    d["prefill"] =
        "full KV of the whole prompt is staged during prefill and compressed at its end (the "
        "method needs "
        "every prompt key): the prefill peak is full KV, reported as "
        "prefill_staged_peak_bytes_measured";
    d["prompt_logits"] =
        "computed with full attention before compressing: KL and perplexity on prompt positions "
        "equal "
        "full KV's by construction; accuracy (the answer decoded from the compressed cache) shows "
        "the "
        "eviction";
  }
  d["decode"] =
      "each generated token displaces the lowest-scored kept prefix key (the observation window "
      "and "
      "generated tokens go last, oldest first): the cache stays at its bytes";
  if (o.method == runtime::EvictionMethod::kSnapKV) {
    d["rule"] =
        "per KV head: the observation window plus the top (capacity - window) prefix keys by the "
        "window's "
        "attention (summed over its queries and the head's query heads), pooled along positions";
  } else {
    d["floor"] = o.adakv_floor;
    d["rule"] =
        "SnapKV's scores; the layer's slots (sum of its heads' capacities) re-divided: every head "
        "keeps the "
        "observation window, each gets floor x the mean per-head prefix budget, the rest goes to "
        "the top "
        "scores across the layer's KV heads, flattened";
  }
  return d;
}

// The eviction baseline's windows (capacities) at `budget` (K/V plus bookkeeping).
MethodWindows eviction_method(const arch::ModelSpec& spec, const BaselineInputs& in,
                              const std::string& name, const EvictionBaseline& e, int64_t budget) {
  MethodWindows m{name, {}, eviction_details(name, e), e.options};
  switch (e.allocation) {
    case Allocation::kUniform:
      m.windows = uniform_selecting_baseline(spec, in.options, budget);
      break;
    case Allocation::kPyramid: {
      const PyramidKVAllocation a =
          pyramidkv_baseline(spec, in.options, budget, e.options.observation_window, kPyramidBeta);
      m.windows = a.windows;
      m.details["pyramidal"] = a.pyramidal;
      m.details["mean_prefix_tokens"] = a.mean_prefix;
      if (!a.pyramidal)
        m.details["fallback"] =
            "min < observation window at this budget: uniform, as PyramidKV's code does";
      break;
    }
    case Allocation::kPolicySlots:
      m.windows = in.policy.head_windows();
      break;
  }
  const auto layers = runtime::evicted_layers(spec, e.options);
  m.selecting_layers = {layers.begin(), layers.end()};
  return m;
}

// DuoAttention's streaming heads: as published (128 sinks + 256 recent tokens), halved together
// only where they would keep more than half the context (small test contexts), so that a
// streaming head still streams. It depends on the context alone, never on the budget: the gates
// are trained once per shape and serve every budget, as in the paper. {recent, sinks}.
std::pair<int64_t, int64_t> duo_streaming_shape(const BaselineInputs& in) {
  int64_t recent = in.duo.streaming_window, sinks = in.duo.sink_tokens;
  while (recent > 1 && recent + sinks > in.options.context / 2) {
    recent = std::max<int64_t>(1, recent / 2);
    sinks /= 2;
  }
  return {recent, sinks};
}

// DuoAttention at its smallest (every head streaming) must fit the bytes: checked before its
// gates are trained, the expensive step.
void require_duo_fits(const arch::ModelSpec& spec, const BaselineInputs& in, int64_t recent,
                      int64_t sinks, int64_t budget) {
  memory::MemoryOptions o = in.options;
  o.sink_tokens = sinks;
  const int64_t smallest = global_kv_bytes(spec, memory::uniform_windows(spec, recent), o);
  if (smallest > budget) {
    throw InfeasibleError(fmt::format(
        "duo baseline: every head streaming ({} sink + {} recent tokens) needs {} global-KV bytes, "
        "the policy has {}",
        sinks, recent, smallest, budget));
  }
}

}  // namespace

memory::MemoryOptions method_options(const MethodWindows& method,
                                     const memory::MemoryOptions& policy_options) {
  memory::MemoryOptions o = policy_options;
  if (method.sink_tokens) o.sink_tokens = *method.sink_tokens;
  return o;
}

// What the policy's heads keep, rule by rule, for the rules it uses (docs/keep-rules.md).
static std::string keep_rules_description(const std::set<std::string>& used) {
  static const std::vector<std::pair<std::string, std::string>> kRules{
      {"h2o",
       "h2o heads: heavy hitters by accumulated attention plus the most recent tokens, half the "
       "slots each"},
      {"snap",
       "snap heads: at the prompt's end the keys its last 32 queries attend to most (max-pooled, "
       "kernel 7) plus that window, then a ring of the most recent tokens"},
      {"window", "window heads: their window, as the grouped cache keeps it"}};
  std::vector<std::string> parts;
  for (const auto& [rule, text] : kRules) {
    if (used.contains(rule)) parts.push_back(text);
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

MethodWindows policy_method(const std::string& name, const policy::Policy& policy) {
  MethodWindows m{name, policy.head_windows()};
  const auto selection = runtime::policy_selection(policy);
  if (!selection) return m;
  nlohmann::json rules = nlohmann::json::object();
  std::set<std::string> used;
  for (const auto& layer : policy.per_layer_policies) {
    for (size_t h = 0; h < layer.kv_head_windows.size(); ++h) {
      used.insert(policy::keep_rule_name(layer.rule(h)));
      rules[std::to_string(layer.layer_id)].push_back(policy::keep_rule_name(layer.rule(h)));
    }
  }
  m.details = {{"kv_head_rules", rules}, {"rule", keep_rules_description(used)}};
  m.eviction = selection;
  m.selecting_layers = selection->layers;
  return m;
}

const std::vector<std::string>& method_names() {
  static const std::vector<std::string> names{
      "headwise", "full", "uniform", "streamingllm", "pyramid-windows", "retrieval-score", "duo",
      "random", "unconditioned",
      // Online eviction as published, each at its own allocation of the same bytes.
      "h2o", "snapkv", "adakv", "pyramidkv", "snapkv-chunked", "adakv-chunked", "pyramidkv-chunked",
      // Ablations: the same rules on the policy's own slots.
      "h2o-headwise-slots", "snapkv-headwise-slots", "adakv-headwise-slots",
      "snapkv-chunked-headwise-slots", "adakv-chunked-headwise-slots"};
  return names;
}

const std::vector<std::string>& baseline_names() {
  static const std::vector<std::string> names(method_names().begin() + 1, method_names().end());
  return names;
}

HeadScores retrieval_scores(arch::DecoderModel& model, const std::vector<EvalSample>& samples) {
  c10::InferenceMode inference;
  HeadScores sum;
  for (int64_t id : model.spec().global_layer_ids()) {
    sum[id].assign(static_cast<size_t>(model.spec().layer(id).attention->num_kv_heads), 0.0);
  }
  int64_t counted = 0;
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(model.device());
  for (const auto& s : samples) {
    const auto needles = needle_positions(s);
    if (needles.empty()) continue;
    const TeacherForced seq = teacher_forced(s);
    RetrievalScoreCore core(at::tensor(seq.generated_rows, long_opts),
                            at::tensor(needles, long_opts), model.attention_chunk());
    (void)model.hidden_states(at::tensor(seq.tokens, long_opts).view({1, -1}), core);
    for (auto& [layer, heads] : sum) {
      for (size_t h = 0; h < heads.size(); ++h) heads[h] += core.mass.at(layer).at(h);
    }
    ++counted;
  }
  if (counted > 0) {
    for (auto& [layer, heads] : sum) {
      for (double& v : heads) v /= static_cast<double>(counted);
    }
  }
  return sum;
}

void require_known_baseline(const std::string& name) {
  const auto& known = baseline_names();
  if (std::find(known.begin(), known.end(), name) != known.end()) return;
  throw_field_error("baselines", " {}: unknown baseline (have: {}){}", name, fmt::join(known, ", "),
                    name == "pyramid"
                        ? "; `pyramid` is now `pyramid-windows` (PyramidKV itself is `pyramidkv`)"
                        : "");
}

MethodWindows build_method(arch::DecoderModel& model, const BaselineInputs& in,
                           const std::string& name, const std::vector<EvalSample>& calibration,
                           BaselineCache* cache) {
  if (name == "headwise") return policy_method(name, in.policy);
  require_known_baseline(name);
  BaselineCache local;
  BaselineCache& memo = cache != nullptr ? *cache : local;
  const auto& spec = model.spec();
  const int64_t budget = budget_of(spec, in);
  // One method; a baseline whose smallest configuration exceeds the bytes throws InfeasibleError.
  const auto build_one = [&]() -> MethodWindows {
    memory::HeadWindows w;
    nlohmann::json details = nlohmann::json::object();
    if (const auto eviction = eviction_baseline(name)) {
      return eviction_method(spec, in, name, *eviction, budget);
    }
    if (name == "full") {
      w = memory::full_kv_windows(spec);
    } else if (name == "uniform") {
      w = uniform_baseline(spec, in.options, budget);
    } else if (name == "streamingllm") {
      // StreamingLLM (Xiao et al., 2023): the first 4 tokens (attention sinks) plus the most
      // recent ones, one window for every head.
      memory::MemoryOptions o = in.options;
      o.sink_tokens = kStreamingSinks;
      MethodWindows m{name,
                      uniform_baseline(spec, o, budget),
                      {{"sink_tokens", kStreamingSinks},
                       {"rule", "attention sinks plus a recent window, every head"}}};
      m.sink_tokens = kStreamingSinks;
      return m;
    } else if (name == "pyramid-windows") {
      w = pyramid_baseline(spec, in.options, budget);
      details = {{"rule",
                  "ablation: PyramidKV's shape of allocation (linearly decreasing with depth) as "
                  "recency windows, without its token selection"}};
    } else if (name == "retrieval-score") {
      if (!memo.retrieval_scores) memo.retrieval_scores = retrieval_scores(model, calibration);
      const HeadScores& scores = *memo.retrieval_scores;
      w = ranked_full_baseline(spec, in.options, budget, scores, in.policy.window_levels.front(),
                               "retrieval-score");
      details["scores"] = scores_json(scores);
    } else if (name == "duo") {
      DuoTrainingOptions duo = in.duo;
      std::tie(duo.streaming_window, duo.sink_tokens) = duo_streaming_shape(in);
      require_duo_fits(spec, in, duo.streaming_window, duo.sink_tokens, budget);
      const auto key = std::make_pair(duo.streaming_window, duo.sink_tokens);
      auto found = memo.duo_gates.find(key);
      if (found == memo.duo_gates.end())
        found = memo.duo_gates.emplace(key, train_duo_gates(model, calibration, duo)).first;
      const DuoGates& trained = found->second;
      memory::MemoryOptions o = in.options;
      o.sink_tokens = duo.sink_tokens;
      MethodWindows m{
          name,
          ranked_full_baseline(spec, o, budget, trained.gates, duo.streaming_window, "duo"),
          {{"gates", scores_json(trained.gates)},
           {"steps", duo.steps},
           {"learning_rate", duo.learning_rate},
           {"l1_weight", duo.l1_weight},
           {"recent_window", duo.streaming_window},
           {"sink_tokens", duo.sink_tokens},
           {"published_shape",
            {{"sink_tokens", in.duo.sink_tokens}, {"recent_window", in.duo.streaming_window}}},
           {"shape_rule",
            "the published shape, sinks and recent window halved together only where they would "
            "keep more than half the context; it depends on the context alone, so one gate "
            "training serves every budget"},
           {"loss",
            "sum over the answer positions of the squared distance between the RMS-normalised "
            "final hidden states of gated and full attention, plus l1_weight x the sum of |gate| "
            "over every global KV head (the paper's); lr warm-up and cool-down over steps/5 "
            "each, as its code"},
           {"loss_first", trained.step_loss.front()},
           {"loss_last", trained.step_loss.back()}}};
      m.sink_tokens = duo.sink_tokens;
      return m;
    } else if (name == "random") {
      w = random_baseline(spec, in.options, budget, in.policy.window_levels, in.seed);
    } else if (name == "unconditioned" && in.unconditioned_policy != nullptr) {
      // Served as the policy is: its windows and, when some heads select tokens, its keep rules.
      MethodWindows ablation = policy_method(name, *in.unconditioned_policy);
      ablation.details["source"] =
          "the policy's calibration rerun with --no-conditioning (same data and options)";
      ablation.details["dataset_sha256"] =
          in.unconditioned_policy->calibration.value("dataset_sha256", "");
      return ablation;
    } else if (name == "unconditioned") {
      w = calibrate_unconditioned(model, in, calibration, budget);
      details = {
          {"source",
           "calibrated in eval without conditioning on the eval tasks' calibration samples (its "
           "data "
           "differs from the policy's; pass --unconditioned-policy for the exact ablation)"},
          {"distortion_measure", calib::distortion_measure_name(calibrated_measure(in.policy))}};
    } else {
      HEADWISE_CHECK(false, "eval: baseline {} is in baseline_names() but has no builder", name);
    }
    return MethodWindows{name, std::move(w), std::move(details)};
  };
  try {
    return build_one();
  } catch (const InfeasibleError& e) {
    // Not run, and said so: the other methods still compare at these bytes.
    MethodWindows m{name, {}};
    m.does_not_fit = e.what();
    m.details = {{"does_not_fit", e.what()}};
    spdlog::warn("eval: {} is not run: {}", name, e.what());
    return m;
  }
}

}  // namespace headwise::eval

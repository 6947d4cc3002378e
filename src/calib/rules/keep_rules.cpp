// Keep rules: which heads fill their slots by a rule that selects tokens. See keep_rules.hpp.
#include "headwise/calib/keep_rules.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>
#include <ranges>

#include "calib/noise/bootstrap.hpp"
#include "calib/noise/decision_noise.hpp"
#include "calib/noise/stable_choice.hpp"
#include "calib/rules/joint_rules.hpp"
#include "calib/rules/layer_trials.hpp"
#include "calib/walk/finite_checks.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/calib/prompt_end.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/eviction_cache.hpp"

namespace headwise::calib {
namespace {

using namespace trials;
using Windows = std::map<int64_t, std::vector<int64_t>>;

// The policy's total bytes with `windows` and the layers in `selecting` holding bookkeeping.
int64_t total_bytes(const arch::ModelSpec& spec, const Windows& windows,
                    const std::set<int64_t>& selecting, const memory::MemoryOptions& options) {
  return memory::estimate(spec, windows, options, selecting).total_bytes;
}

// Layer `layer`'s windows with the heads of `selectors` selecting tokens, those heads giving up
// slots one block at a time (the largest first) until the whole policy fits the budget; nullopt
// when it cannot. `slots_given_up` receives how many they gave.
std::optional<std::vector<int64_t>> pay_for_bookkeeping(
    const arch::ModelSpec& spec, Windows windows, std::set<int64_t> selecting, int64_t layer,
    const std::set<int64_t>& selectors, const KeepRuleOptions& o, int64_t& slots_given_up) {
  selecting.insert(layer);
  std::vector<int64_t>& heads = windows.at(layer);
  slots_given_up = 0;
  while (total_bytes(spec, windows, selecting, o.memory) > o.budget_bytes) {
    int64_t widest = -1, widest_slots = 0;
    for (int64_t h : selectors) {
      const int64_t slots = memory::global_head_slots(heads[static_cast<size_t>(h)], o.memory);
      if (slots > widest_slots) {
        widest = h;
        widest_slots = slots;
      }
    }
    // One block fewer: the window that gives exactly those slots.
    const int64_t window = widest_slots - o.memory.block_size - o.memory.sink_tokens;
    if (widest < 0 || window < 1) return std::nullopt;
    heads[static_cast<size_t>(widest)] = window;
    slots_given_up += o.memory.block_size;
  }
  return heads;
}

// One global layer's pass: measures its trials (on the answer span, or exactly on every token)
// and keeps the best. Everything it reads lives in the pass; the layer's decision is its result.
class LayerPass {
 public:
  struct Decision {
    Trial chosen;
    std::vector<int64_t> windows;  // the layer's, its selecting heads' slots paid for
    KeepRuleLayer report;
    std::optional<KeepRuleNoise> noise;  // how sure it is (per-sequence values kept)
  };

  LayerPass(const KeepRuleContext& context, const KeepRuleOptions& o, int64_t layer,
            const Windows& decided, const std::set<int64_t>& selecting, int64_t tokens,
            ActivationStream& stream, std::optional<AnswerReference>& exact_measure,
            int64_t& evaluations, uint64_t seed)
      : context_(context),
        o_(o),
        layer_(layer),
        decided_(decided),
        selecting_(selecting),
        base_(decided.at(layer)),
        stream_(stream),
        exact_measure_(exact_measure),
        evaluations_(evaluations),
        seed_(seed) {
    decision_.report.layer_id = layer;
    decision_.report.candidates = evicting_heads(base_, tokens, o.memory);
    decision_.windows = base_;
  }

  Decision run() {
    const auto& candidates = decision_.report.candidates;
    if (candidates.empty()) return decision_;
    bool exhaustive = false;
    if (o_.span != nullptr) exhaustive = measure_span_batch();
    best_ = least_ = decision_.report.divergence_windows =
        site_ ? span_value({}, base_) : exact_measure_->evaluate(layer_, stream_, base_);
    ++evaluations_;
    if (exhaustive) {
      choose_among_batch();
    } else {
      // One pass: each head tries each rule once, given the rules chosen before it.
      for (int64_t h : candidates) {
        for (const auto& rule : o_.rules) try_head(h, rule);
      }
    }
    decision_.report.divergence_chosen = best_;
    decision_.noise = noise();
    return decision_;
  }

 private:
  // The windows of a trial's layer, its selecting heads paying for the bookkeeping (nullopt: no
  // room).
  std::optional<std::vector<int64_t>> paid_for(const Trial& trial, int64_t& given_up) const {
    Windows windows = decided_;
    windows[layer_] = base_;
    return pay_for_bookkeeping(context_.spec, windows, selecting_, layer_, trial_heads(trial), o_,
                               given_up);
  }

  // Every trial the pass can reach, measured in one batch when there are few: returns whether it
  // did (the pass then chooses the best of them, not one head at a time: a lone h2o head pays the
  // layer's whole bookkeeping from its slots; measured on the 8K default model, the first head's
  // trial then looks worse than its window while three heads at 448 slots beat it).
  bool measure_span_batch() {
    site_.emplace(o_.span->capture(layer_, stream_, /*keep_attention=*/true));
    trials_.emplace(context_, *site_, decision_.report.candidates, base_);
    const std::vector<Trial> reachable = every_trial(decision_.report.candidates, o_.rules);
    std::vector<Trial> batch;
    std::vector<SpanOutputs> outputs;
    for (const auto& trial : reachable) {
      int64_t given_up = 0;
      const auto paid = trial.empty() ? std::optional(base_) : paid_for(trial, given_up);
      if (!paid) continue;
      batch.push_back(trial);
      outputs.push_back(trials_->compose(*paid, trial));
    }
    std::vector<SequenceValues> per_sequence;
    const auto values =
        o_.span->evaluate(*site_, outputs, fmt::format("layer {}: keep rules", layer_),
                          keeps_sequences() ? &per_sequence : nullptr);
    for (size_t t = 0; t < batch.size(); ++t) span_memo_.emplace(batch[t], values[t]);
    for (size_t t = 0; t < per_sequence.size(); ++t)
      span_sequences_.emplace(batch[t], per_sequence[t]);
    return reachable.size() > 1;
  }

  // The span measure of a trial, from the batch or on its own.
  double span_value(const Trial& trial, const std::vector<int64_t>& paid) {
    if (!span_memo_.contains(trial)) {
      std::vector<SequenceValues> per_sequence;
      span_memo_[trial] =
          o_.span
              ->evaluate(*site_, {trials_->compose(paid, trial)},
                         fmt::format("layer {}: {}", layer_, rules_label(paid, trial)),
                         keeps_sequences() ? &per_sequence : nullptr)
              .front();
      if (!per_sequence.empty()) span_sequences_.emplace(trial, std::move(per_sequence.front()));
    }
    return span_memo_.at(trial);
  }

  void choose_among_batch() {
    if (stable()) return choose_stably();
    for (const auto& [trial, value] : span_memo_) {
      if (trial.empty()) continue;
      ++evaluations_;
      int64_t given_up = 0;
      const auto paid = paid_for(trial, given_up);
      spdlog::info("layer {} {}: {} {:.6g}", layer_, rules_label(*paid, trial),
                   divergence_label(o_.divergence), value);
      keep_if_better(trial, *paid, given_up, value);
    }
  }

  void try_head(int64_t head, const policy::KeepRule& rule) {
    Trial trial = decision_.chosen;
    trial[head] = rule;
    int64_t given_up = 0;
    const auto paid = paid_for(trial, given_up);
    if (!paid) {
      spdlog::info(
          "layer {} head {}: {} does not fit the budget with the layer's selection bookkeeping",
          layer_, head, rule.name());
      return;
    }
    double divergence = 0.0;
    if (site_) {
      divergence = span_value(trial, *paid);
    } else {
      RuleCore core(context_, layer_, *paid, trial);
      divergence = exact_measure_->evaluate_attention(
          layer_, stream_,
          [&](const arch::AttentionInputs& in, int64_t) { return core.attend(in); },
          rules_label(*paid, trial));
    }
    ++evaluations_;
    spdlog::info("layer {} {}: {} {:.6g} (best so far {:.6g})", layer_, rules_label(*paid, trial),
                 divergence_label(o_.divergence), divergence, best_);
    least_ = std::min(least_, divergence);
    if (stable()) {
      // The head takes the rule (the order's preference, choose_stably) unless it measures
      // worse than the least trial so far by the minimum effect.
      if (!noise::worse_by_effect(divergence, least_, noise::kStableRuleEffect))
        take(trial, *paid, given_up, divergence);
      return;
    }
    keep_if_better(trial, *paid, given_up, divergence);
  }

  // Per-sequence values for the trials, for the decision noise (the pooled values do not change
  // with them; the stable rule reads the pooled values alone).
  bool keeps_sequences() const { return o_.decision_noise; }

  // The layer's trial windows: its selecting heads' slots paid for (a measured trial always fits).
  std::vector<int64_t> trial_windows(const Trial& trial) const {
    int64_t given_up = 0;
    return trial.empty() ? base_ : *paid_for(trial, given_up);
  }

  // How sure the decision is: the chosen trial against every other trial measured, bootstrapped
  // over the sequences (noise::decision_gap; J = D: every measured trial fits the budget).
  std::optional<KeepRuleNoise> noise() const {
    if (!o_.decision_noise || !span_sequences_.contains(decision_.chosen)) return std::nullopt;
    std::vector<const Trial*> trials{&decision_.chosen};
    std::vector<noise::Contender> contenders{
        {&span_sequences_.at(decision_.chosen), span_memo_.at(decision_.chosen)}};
    for (const auto& [trial, values] : span_sequences_) {
      if (trial == decision_.chosen) continue;
      trials.push_back(&trial);
      contenders.push_back({&values, span_memo_.at(trial)});
    }
    KeepRuleNoise out;
    static_cast<DecisionGap&>(out) = noise::decision_gap(contenders, seed_);
    out.layer_id = layer_;
    out.windows = decision_.windows;
    out.rules = rules_of(decision_.chosen, base_.size());
    if (const size_t runner = noise::runner_up(contenders); runner > 0) {
      out.runner_up_windows = trial_windows(*trials[runner]);
      out.runner_up_rules = rules_of(*trials[runner], base_.size());
    }
    return out;
  }

  // --decisions stable, with the span measure.
  bool stable() const { return o_.stable_decisions && site_.has_value(); }

  // The first trial of a fixed order that does not measure worse than the least measured trial by
  // the minimum effect kStableRuleEffect (noise::worse_by_effect), else the least: first the
  // trial with every evicting head selecting (the most selecting heads, then the lower heads':
  // the map order), then every head at its window. A head takes the rules the user listed unless
  // that is shown to cost the answers more, and keeps its window unless that is.
  // Why these two and not the first of the whole order within the effect: with 16 trials between
  // every head selecting and every head at its window, the first one within the minimum effect was
  // a different trial under every seed (layer 3 of the 8K default model at 25%, where every seed's
  // least is every head at its window: seed 0 took [2048,1600:h2o,2048,512:h2o], seed 1
  // [2048,2048,2048,64:h2o]). Why the windows second, not the least straight away: there, under
  // seed 8 of 10, the least was head 3 at h2o and the others' windows, and the rule took it.
  // Why selecting first: with the window first the choice sat at the edge of the separation (on
  // that model's layer 1, h2o lowered the span divergence by 0.22-1.17 times the best's across
  // seeds 0-4), while there every head selecting was within 0.05 of the least (seed 0).
  void choose_stably() {
    const Trial* least = nullptr;
    const Trial* preferred = nullptr;
    for (const auto& [trial, value] : span_memo_) {
      if (least == nullptr || value < span_memo_.at(*least)) least = &trial;
      if (preferred == nullptr || trial.size() > preferred->size()) preferred = &trial;
    }
    const Trial windows;  // every head at its window: always measured (measure_span_batch)
    const double least_value = span_memo_.at(*least);
    const Trial* chosen = least;
    for (const Trial* t : {preferred, &windows}) {
      if (!noise::worse_by_effect(span_memo_.at(*t), least_value, noise::kStableRuleEffect)) {
        chosen = t;
        break;
      }
    }
    evaluations_ += static_cast<int64_t>(span_memo_.size()) - 1;
    int64_t given_up = 0;
    const auto paid = chosen->empty() ? std::optional(base_) : paid_for(*chosen, given_up);
    const auto gap = [&](const Trial& t) { return span_memo_.at(t) / least_value - 1.0; };
    spdlog::info(
        "layer {} {}: {} {:.6g}, the stable choice (least: {} {:.6g}; every head selecting {} "
        "{:.3f} worse, every head at its window {:.3f} worse; the minimum effect {})",
        layer_, rules_label(*paid, *chosen), divergence_label(o_.divergence),
        span_memo_.at(*chosen), rules_label(base_, *least), least_value,
        rules_label(base_, *preferred), gap(*preferred), gap(windows), noise::kStableRuleEffect);
    take(*chosen, *paid, given_up, span_memo_.at(*chosen));
  }

  void keep_if_better(const Trial& trial, const std::vector<int64_t>& paid, int64_t given_up,
                      double value) {
    if (value < best_) take(trial, paid, given_up, value);
  }

  void take(const Trial& trial, const std::vector<int64_t>& paid, int64_t given_up, double value) {
    best_ = value;
    decision_.chosen = trial;
    decision_.windows = paid;
    decision_.report.slots_given_up = given_up;
  }

  const KeepRuleContext& context_;
  const KeepRuleOptions& o_;
  int64_t layer_;
  const Windows& decided_;
  const std::set<int64_t>& selecting_;
  std::vector<int64_t> base_;
  ActivationStream& stream_;
  std::optional<AnswerReference>& exact_measure_;
  int64_t& evaluations_;
  std::optional<SpanSite> site_;
  std::optional<SpanTrials> trials_;
  uint64_t seed_;                                   // the decision noise's bootstrap draws
  std::map<Trial, double> span_memo_;               // trial → divergence (the span measure)
  std::map<Trial, SequenceValues> span_sequences_;  // per sequence: the decision noise's
  double best_ = 0.0;
  double least_ = 0.0;  // the least trial measured so far (--decisions stable, one head at a time)
  Decision decision_;
};

}  // namespace

std::vector<policy::KeepRule> parse_keep_rules(const std::string& text) {
  const auto& registered = policy::keep_rule_names();
  std::set<std::string> named;
  for (const auto piece : std::views::split(text, ',')) {
    const std::string part(piece.begin(), piece.end());
    if (std::find(registered.begin(), registered.end(), part) == registered.end() ||
        !named.insert(part).second) {
      named.clear();
      break;
    }
  }
  if (!named.contains(policy::KeepRule::kWindow.name())) {
    throw_field_error("keep_rules",
                      ": '{}' is not auto or a list of keep rules that includes window (each once; "
                      "rules: {})",
                      text, fmt::join(registered, ", "));
  }
  std::vector<policy::KeepRule> rules;
  for (const auto& name : registered) {
    if (named.contains(name) && name != policy::KeepRule::kWindow.name())
      rules.push_back(policy::KeepRule::from_name(name, "keep_rules"));
  }
  return rules;
}

std::string resolve_keep_rules(const std::string& text, DistortionMeasure measure) {
  if (text == "auto") return measure_traits(measure).scores_answers ? "window,h2o" : "window";
  const std::vector<policy::KeepRule> rules = parse_keep_rules(text);
  if (rules.empty()) return "window";
  if (!measure_traits(measure).scores_answers) {
    throw_field_error(
        "keep_rules",
        " {}: the rules are measured at the answers; use an answer measure ({} answer-tv or "
        "answer-kl), not {}",
        text, field_ref("distortion"), distortion_measure_name(measure));
  }
  std::string spelling = policy::KeepRule::kWindow.name();
  for (const auto& rule : rules) spelling += "," + rule.name();
  return spelling;
}

KeepRuleResult choose_keep_rules(arch::DecoderModel& model,
                                 const std::vector<std::vector<int64_t>>& sequences,
                                 const std::vector<std::vector<int64_t>>& answers,
                                 const Windows& windows, const KeepRuleOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const arch::ModelSpec& spec = model.spec();
  HEADWISE_CHECK(!sequences.empty() && o.prefill_chunk > 0,
                 "keep rules: {} sequences, prefill chunk {}", sequences.size(), o.prefill_chunk);
  for (const auto& rule : o.rules) {
    HEADWISE_CHECK(rule.selects_tokens(), "keep rules: window is every head's base, not a trial");
    keep_rule_method(rule);  // a rule without a method fails here, before any layer runs
  }
  const auto tokens = static_cast<int64_t>(sequences.front().size());
  const KeepRuleContext context{spec, o.memory, o.prefill_chunk, model.attention_chunk(),
                                rules_prompt_end(o.rules, answers, o.follow_ups)};
  // A rule offered at every level is chosen with the levels, across the layers (joint_rules.hpp).
  if (offered_at_every_level(o.rules))
    return choose_keep_rules_jointly(model, sequences, windows, o, context);
  KeepRuleResult result;
  result.windows = windows;
  std::set<int64_t> selecting;
  HEADWISE_CHECK(total_bytes(spec, windows, selecting, o.memory) <= o.budget_bytes,
                 "keep rules: the windows exceed the budget");

  // The exact measure runs the layers above over every token per trial; the span measure runs them
  // on the answer span against its caches (answer_span.hpp).
  std::optional<AnswerReference> exact_measure;
  if (o.span == nullptr) {
    exact_measure.emplace(model, sequences, answers, o.micro_batch, o.memory.sink_tokens,
                          dist::single_process(), o.divergence);
  }
  ActivationStream stream(model, sequences, o.micro_batch, o.activations);
  arch::ExactAttentionCore exact(context.attention_chunk);
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    model.prefetch_layer(i + 1);
    const bool global = spec.layer(i).is_global();
    Trial chosen;
    if (global) {
      auto decision =
          LayerPass(context, o, i, result.windows, selecting, tokens, stream, exact_measure,
                    result.evaluations, noise::decision_seed(sequences, i))
              .run();
      chosen = decision.chosen;
      result.windows[i] = decision.windows;
      if (!chosen.empty()) {
        selecting.insert(i);
        decision.report.selection_bytes =
            memory::selection_bytes(*spec.layer(i).attention, decision.windows, o.memory);
      }
      result.rules[i] = rules_of(chosen, decision.windows.size());
      result.layers.push_back(std::move(decision.report));
      if (decision.noise) result.noise.push_back(std::move(*decision.noise));
    }
    // The stream the layers above see: this layer as decided (conditioned) or at full KV.
    if (global && o.conditioned) {
      RuleCore core(context, i, result.windows.at(i), chosen);
      stream.apply([&](const at::Tensor& h) {
        return checked_finite(model.run_layer(i, h, {&core, nullptr, 0}), i, spec.layer(i).kind);
      });
    } else {
      stream.apply([&](const at::Tensor& h) {
        return checked_finite(model.run_layer(i, h, {&exact, nullptr, 0}), i, spec.layer(i).kind);
      });
    }
    model.release_layer(i);
  }
  HEADWISE_CHECK(total_bytes(spec, result.windows, selecting, o.memory) <= o.budget_bytes,
                 "keep rules: over the budget");
  if (o.span != nullptr) result.divergence_final = o.span->evaluate_final(stream);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

nlohmann::json keep_rules_json(const KeepRuleResult& result) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : result.layers) {
    nlohmann::json rules = nlohmann::json::array();
    for (auto rule : result.rules.at(l.layer_id)) rules.push_back(policy::keep_rule_name(rule));
    nlohmann::json windows = nlohmann::json::array();
    for (int64_t w : result.windows.at(l.layer_id)) windows.push_back(window_label(w));
    layers.push_back({{"layer_id", l.layer_id},
                      {"candidates", l.candidates},
                      {"kv_head_rules", rules},
                      {"kv_head_windows", windows},
                      {"divergence_windows", l.divergence_windows},
                      {"divergence_chosen", l.divergence_chosen},
                      {"selection_bytes", l.selection_bytes},
                      {"slots_given_up", l.slots_given_up}});
    if (l.joint_chosen >= 0) {
      layers.back()["joint_check"] = {
          {"chosen", l.joint_chosen}, {"walk", l.joint_walk}, {"repaired", l.repaired}};
    }
  }
  nlohmann::json out = {
      {"layers", layers}, {"evaluations", result.evaluations}, {"seconds", result.seconds}};
  if (result.divergence_final >= 0) out["end_to_end"] = result.divergence_final;
  if (const auto& p = result.prefill_peak) {
    out["prefill_peak"] = {{"bound_bytes", p->bound},
                           {"schedule", p->schedule},
                           {"prompt_tokens", p->prompt_tokens},
                           {"peak_bytes", p->peak}};
  }
  return out;
}

}  // namespace headwise::calib

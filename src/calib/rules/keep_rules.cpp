// Keep rules: which heads fill their slots with heavy hitters. See keep_rules.hpp.
#include "headwise/calib/keep_rules.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>

#include "calib/walk/finite_checks.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/eviction_cache.hpp"

namespace headwise::calib {
namespace {

using Windows = std::map<int64_t, std::vector<int64_t>>;

// One global layer as the runtime runs it: H2O in the heads of `h2o`, windows in the others
// (when `h2o` is empty, plain windowed attention, as the grouped cache). Every other layer exact.
class RuleCore final : public arch::AttentionCore {
 public:
  RuleCore(const arch::ModelSpec& spec, int64_t layer, const std::vector<int64_t>& windows,
           const std::set<int64_t>& h2o, const KeepRuleOptions& o, int64_t chunk)
      : spec_(spec),
        layer_(layer),
        windows_(windows),
        h2o_(h2o),
        options_(o),
        chunk_(chunk),
        exact_(chunk) {}

  at::Tensor attend(const arch::AttentionInputs& in) override {
    if (in.layer_id != layer_) return exact_.attend(in);
    if (h2o_.empty())
      return arch::windowed_attention(in, windows_, options_.memory.sink_tokens, chunk_);
    runtime::EvictionOptions eviction;
    eviction.method = runtime::EvictionMethod::kH2O;
    eviction.layers = {layer_};
    for (int64_t h = 0; h < static_cast<int64_t>(windows_.size()); ++h) {
      if (!h2o_.contains(h)) eviction.window_heads.insert({layer_, h});
    }
    return runtime::simulate_eviction(spec_, in, windows_, options_.memory, eviction,
                                      options_.prefill_chunk, chunk_);
  }

 private:
  const arch::ModelSpec& spec_;
  int64_t layer_;
  std::vector<int64_t> windows_;
  std::set<int64_t> h2o_;
  const KeepRuleOptions& options_;
  int64_t chunk_;
  arch::ExactAttentionCore exact_;
};

// The answer-span measure's trials of one layer: each KV head's attention output at the span,
// from the site's window outputs or from H2O at the head's slots. H2O chooses each head's tokens
// from that head's own scores, so one eviction run with every candidate head under H2O at a
// given window gives every candidate's output at it: a layer runs the eviction once per distinct
// window its trials give their h2o heads, not once per trial.
class SpanTrials {
 public:
  SpanTrials(const arch::ModelSpec& spec, const SpanSite& site,
             const std::vector<int64_t>& candidates, const std::vector<int64_t>& base,
             const KeepRuleOptions& o, int64_t chunk)
      : spec_(spec),
        site_(site),
        candidates_(candidates),
        base_(base),
        options_(o),
        chunk_(chunk) {}

  SpanOutputs compose(const std::vector<int64_t>& windows, const std::set<int64_t>& h2o) {
    SpanOutputs out;
    for (size_t m = 0; m < site_.input.size(); ++m) {
      const auto kv = static_cast<int64_t>(windows.size());
      at::Tensor composed;
      for (int64_t h = 0; h < kv; ++h) {
        const int64_t w = windows[static_cast<size_t>(h)];
        const at::Tensor& source =
            h2o.contains(h) ? h2o_at(w)[m] : site_.levels.at(w)[m];  // [Bm, S, heads, hd]
        if (!composed.defined()) composed = at::empty_like(source);
        const int64_t group = source.size(2) / kv;
        composed.slice(2, h * group, (h + 1) * group)
            .copy_(source.slice(2, h * group, (h + 1) * group));
      }
      out.push_back(composed);
    }
    return out;
  }

 private:
  const SpanOutputs& h2o_at(int64_t window) {
    auto it = h2o_.find(window);
    if (it != h2o_.end()) return it->second;
    std::vector<int64_t> windows = base_;
    runtime::EvictionOptions eviction;
    eviction.method = runtime::EvictionMethod::kH2O;
    eviction.layers = {site_.layer};
    for (int64_t h = 0; h < static_cast<int64_t>(windows.size()); ++h) {
      if (std::find(candidates_.begin(), candidates_.end(), h) != candidates_.end()) {
        windows[static_cast<size_t>(h)] = window;
      } else {
        eviction.window_heads.insert({site_.layer, h});
      }
    }
    SpanOutputs outputs;
    for (const auto& in : site_.attention) {
      const at::Tensor all = runtime::simulate_eviction(spec_, in, windows, options_.memory,
                                                        eviction, options_.prefill_chunk, chunk_);
      outputs.push_back(all.slice(1, all.size(1) - site_.input.front().size(1), all.size(1)));
    }
    return h2o_.emplace(window, std::move(outputs)).first->second;
  }

  const arch::ModelSpec& spec_;
  const SpanSite& site_;
  const std::vector<int64_t>& candidates_;
  std::vector<int64_t> base_;
  const KeepRuleOptions& options_;
  int64_t chunk_;
  std::map<int64_t, SpanOutputs> h2o_;  // window → every candidate head's H2O output at the span
};

// With the span measure, a layer with at most this many candidate heads measures every set of them
// in one batch (2^n - 1 trials); above it, each trial runs when the pass reaches it.
constexpr size_t kBatchedTrialHeads = 4;

// The policy's total bytes with `windows` and the layers in `selecting` holding bookkeeping.
int64_t total_bytes(const arch::ModelSpec& spec, const Windows& windows,
                    const std::set<int64_t>& selecting, const memory::MemoryOptions& options) {
  return memory::estimate(spec, windows, options, selecting).total_bytes;
}

// Layer `layer`'s windows with the heads of `h2o` selecting tokens, the h2o heads giving up
// slots one block at a time (the largest first) until the whole policy fits the budget; nullopt
// when it cannot. `slots_given_up` receives how many they gave.
std::optional<std::vector<int64_t>> pay_for_bookkeeping(
    const arch::ModelSpec& spec, Windows windows, std::set<int64_t> selecting, int64_t layer,
    const std::set<int64_t>& h2o, const KeepRuleOptions& o, int64_t& slots_given_up) {
  selecting.insert(layer);
  std::vector<int64_t>& heads = windows.at(layer);
  slots_given_up = 0;
  while (total_bytes(spec, windows, selecting, o.memory) > o.budget_bytes) {
    int64_t widest = -1, widest_slots = 0;
    for (int64_t h : h2o) {
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

std::string rules_label(const std::vector<int64_t>& windows, const std::set<int64_t>& h2o) {
  std::string out;
  for (size_t h = 0; h < windows.size(); ++h) {
    out += fmt::format("{}{}{}", h == 0 ? "" : ",", window_label(windows[h]),
                       h2o.contains(static_cast<int64_t>(h)) ? ":h2o" : "");
  }
  return "[" + out + "]";
}

}  // namespace

bool parse_keep_rules(const std::string& text) {
  if (text == "window") return false;
  if (text == "window,h2o" || text == "h2o,window") return true;
  throw_field_error("keep_rules", ": '{}' is not one of auto, window, window,h2o", text);
}

std::string resolve_keep_rules(const std::string& text, DistortionMeasure measure) {
  if (text == "auto") return measure_traits(measure).scores_answers ? "window,h2o" : "window";
  if (!parse_keep_rules(text)) return "window";
  if (!measure_traits(measure).scores_answers) {
    throw_field_error(
        "keep_rules",
        " {}: the rules are measured at the answers; use an answer measure ({} answer-tv or "
        "answer-kl), not {}",
        text, field_ref("distortion"), distortion_measure_name(measure));
  }
  return "window,h2o";
}

KeepRuleResult choose_keep_rules(arch::DecoderModel& model,
                                 const std::vector<std::vector<int64_t>>& sequences,
                                 const std::vector<std::vector<int64_t>>& answers,
                                 const Windows& windows, const KeepRuleOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const arch::ModelSpec& spec = model.spec();
  const int64_t chunk = model.attention_chunk();
  HEADWISE_CHECK(!sequences.empty() && o.prefill_chunk > 0,
                 "keep rules: {} sequences, prefill chunk {}", sequences.size(), o.prefill_chunk);
  const auto tokens = static_cast<int64_t>(sequences.front().size());
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
  arch::ExactAttentionCore exact(chunk);
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    model.prefetch_layer(i + 1);
    const bool global = spec.layer(i).is_global();
    std::set<int64_t> chosen;
    if (global) {
      KeepRuleLayer report;
      report.layer_id = i;
      const std::vector<int64_t> base = windows.at(i);
      for (int64_t h = 0; h < static_cast<int64_t>(base.size()); ++h) {
        if (memory::global_head_slots(base[static_cast<size_t>(h)], o.memory) < tokens)
          report.candidates.push_back(h);
      }
      std::vector<int64_t> current = base;
      double best = 0.0;
      // The windows of a trial's layer, its h2o heads paying for the bookkeeping (nullopt: no
      // room).
      const auto paid_for = [&](const std::set<int64_t>& trial, int64_t& given_up) {
        Windows trial_windows = result.windows;
        trial_windows[i] = base;
        return pay_for_bookkeeping(spec, trial_windows, selecting, i, trial, o, given_up);
      };
      std::optional<SpanSite> site;
      std::optional<SpanTrials> trials;
      std::map<std::set<int64_t>, double> span_memo;  // trial → divergence (the span measure)
      // Every set of candidates measured: choose the best set, not one head at a time. (A lone h2o
      // head pays the layer's whole bookkeeping from its slots; measured on the 8K default model,
      // the first head's trial then looks worse than its window while three heads at 448 slots beat
      // it.)
      bool exhaustive = false;
      if (o.span != nullptr && !report.candidates.empty()) {
        site.emplace(o.span->capture(i, stream, /*keep_attention=*/true));
        trials.emplace(spec, *site, report.candidates, base, o, chunk);
        // Every trial the pass can reach, in one batch when there are few: the windows, then each
        // set of candidates (the pass tries each head given the ones chosen before it).
        std::vector<std::set<int64_t>> reachable{{}};
        if (report.candidates.size() <= kBatchedTrialHeads) {
          for (size_t mask = 1; mask < (size_t{1} << report.candidates.size()); ++mask) {
            std::set<int64_t> trial;
            for (size_t c = 0; c < report.candidates.size(); ++c) {
              if (mask >> c & 1) trial.insert(report.candidates[c]);
            }
            reachable.push_back(trial);
          }
        }
        std::vector<std::set<int64_t>> batch;
        std::vector<SpanOutputs> outputs;
        for (const auto& trial : reachable) {
          int64_t given_up = 0;
          const auto paid = trial.empty() ? std::optional(base) : paid_for(trial, given_up);
          if (!paid) continue;
          batch.push_back(trial);
          outputs.push_back(trials->compose(*paid, trial));
        }
        const auto values =
            o.span->evaluate(*site, outputs, fmt::format("layer {}: keep rules", i));
        for (size_t t = 0; t < batch.size(); ++t) span_memo.emplace(batch[t], values[t]);
        exhaustive = reachable.size() > 1;
      }
      // The span measure of a trial, from the batch or on its own.
      const auto span_value = [&](const std::set<int64_t>& trial,
                                  const std::vector<int64_t>& paid) {
        if (!span_memo.contains(trial)) {
          span_memo[trial] =
              o.span
                  ->evaluate(*site, {trials->compose(paid, trial)},
                             fmt::format("layer {}: {}", i, rules_label(paid, trial)))
                  .front();
        }
        return span_memo.at(trial);
      };
      if (!report.candidates.empty()) {
        best = report.divergence_windows =
            site ? span_value({}, base) : exact_measure->evaluate(i, stream, base);
        ++result.evaluations;
      }
      if (exhaustive) {
        for (const auto& [trial, value] : span_memo) {
          if (trial.empty()) continue;
          ++result.evaluations;
          int64_t given_up = 0;
          const auto paid = paid_for(trial, given_up);
          spdlog::info("layer {} {}: {} {:.6g}", i, rules_label(*paid, trial),
                       divergence_label(o.divergence), value);
          if (value < best) {
            best = value;
            chosen = trial;
            current = *paid;
            report.slots_given_up = given_up;
          }
        }
      }
      for (int64_t h : exhaustive ? std::vector<int64_t>{} : report.candidates) {
        std::set<int64_t> trial = chosen;
        trial.insert(h);
        int64_t given_up = 0;
        const auto paid = paid_for(trial, given_up);
        if (!paid) {
          spdlog::info(
              "layer {} head {}: h2o does not fit the budget with the layer's selection "
              "bookkeeping",
              i, h);
          continue;
        }
        double divergence = 0.0;
        if (site) {
          divergence = span_value(trial, *paid);
        } else {
          RuleCore core(spec, i, *paid, trial, o, chunk);
          divergence = exact_measure->evaluate_attention(
              i, stream, [&](const arch::AttentionInputs& in, int64_t) { return core.attend(in); },
              rules_label(*paid, trial));
        }
        ++result.evaluations;
        spdlog::info("layer {} {}: {} {:.6g} (best so far {:.6g})", i, rules_label(*paid, trial),
                     divergence_label(o.divergence), divergence, best);
        if (divergence < best) {
          best = divergence;
          chosen = trial;
          current = *paid;
          report.slots_given_up = given_up;
        }
      }
      report.divergence_chosen = best;
      result.windows[i] = current;
      if (!chosen.empty()) {
        selecting.insert(i);
        report.selection_bytes =
            memory::selection_bytes(*spec.layer(i).attention, current, o.memory);
      }
      std::vector<policy::KeepRule> rules(base.size(), policy::KeepRule::kWindow);
      for (int64_t h : chosen) rules[static_cast<size_t>(h)] = policy::KeepRule::kH2O;
      result.rules[i] = rules;
      result.layers.push_back(report);
    }
    // The stream the layers above see: this layer as decided (conditioned) or at full KV.
    if (global && o.conditioned) {
      RuleCore core(spec, i, result.windows.at(i), chosen, o, chunk);
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
  }
  nlohmann::json out = {
      {"layers", layers}, {"evaluations", result.evaluations}, {"seconds", result.seconds}};
  if (result.divergence_final >= 0) out["end_to_end"] = result.divergence_final;
  return out;
}

}  // namespace headwise::calib

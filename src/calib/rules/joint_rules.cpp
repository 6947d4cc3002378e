// The joint keep-rule pass: every head's rule and level chosen together (joint_rules.hpp).
#include "calib/rules/joint_rules.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "calib/rules/layer_trials.hpp"
#include "calib/walk/finite_checks.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib {
namespace {

using Windows = std::map<int64_t, std::vector<int64_t>>;

using joint::Decision;
using joint::HeadOption;
using joint::JointCheck;
using joint::LayerOptions;
using trials::copy_head;

// `base` with head h's group taken from `from`, per micro-batch.
SpanOutputs with_head(const SpanOutputs& base, const SpanOutputs& from, int64_t h, int64_t kv) {
  SpanOutputs out;
  for (size_t m = 0; m < base.size(); ++m) {
    at::Tensor t = base[m].clone();
    copy_head(t, from[m], h, kv);
    out.push_back(t);
  }
  return out;
}

// Every head's output at the span under `rule` with `level`'s slots: one run of the layer.
SpanOutputs rule_run(const KeepRuleContext& context, const SpanSite& site,
                     const policy::KeepRule& rule, int64_t level, int64_t kv) {
  const std::vector<int64_t> windows(static_cast<size_t>(kv), level);
  std::set<int64_t> heads;
  for (int64_t h = 0; h < kv; ++h) heads.insert(h);
  SpanOutputs out;
  for (const auto& in : site.attention) {
    const at::Tensor all = keep_rule_method(rule).attend(context, in, windows, heads);
    out.push_back(all.slice(1, all.size(1) - site.input.front().size(1), all.size(1)));
  }
  return out;
}

// Step 1 at one layer: every head's options, measured in one batch.
LayerOptions measure_layer(const KeepRuleContext& context, const KeepRuleOptions& o,
                           const SpanSite& site, const std::vector<int64_t>& base, int64_t tokens) {
  const auto kv = static_cast<int64_t>(base.size());
  LayerOptions out;
  out.layer = site.layer;
  out.heads.resize(base.size());
  const SpanOutputs base_outputs = site.compose(base);
  std::vector<SpanOutputs> candidates{base_outputs};
  std::vector<std::pair<int64_t, HeadOption>> where;  // per candidate after the base
  for (int64_t h = 0; h < kv; ++h) {
    for (const auto& entry : site.levels) {
      const int64_t level = entry.first;
      std::vector<int64_t> windows = base;
      windows[static_cast<size_t>(h)] = level;
      candidates.push_back(site.compose(windows));
      where.push_back({h, {policy::KeepRule::kWindow, level}});
    }
  }
  for (const auto& rule : o.rules) {
    for (const auto& entry : site.levels) {
      const int64_t level = entry.first;
      if (memory::global_head_slots(level, o.memory) >= tokens) continue;  // never evicts
      const SpanOutputs run = rule_run(context, site, rule, level, kv);
      for (int64_t h = 0; h < kv; ++h) {
        candidates.push_back(with_head(base_outputs, run, h, kv));
        where.push_back({h, {rule, level}});
      }
    }
  }
  const auto values =
      o.span->evaluate(site, candidates, fmt::format("layer {}: joint keep rules", site.layer));
  out.base = values.front();
  out.evaluations = static_cast<int64_t>(values.size());
  for (size_t c = 0; c < where.size(); ++c) {
    HeadOption option = where[c].second;
    option.divergence = values[c + 1];
    out.heads[static_cast<size_t>(where[c].first)].push_back(option);
  }
  return out;
}

// A global layer as the runtime serves it: each head at its level under its rule.
class JointCore final : public arch::AttentionCore {
 public:
  JointCore(const KeepRuleContext& context, int64_t layer, std::vector<int64_t> levels,
            std::vector<policy::KeepRule> rules)
      : context_(context), layer_(layer), levels_(std::move(levels)), rules_(std::move(rules)) {}

  at::Tensor attend(const arch::AttentionInputs& in) override {
    HEADWISE_CHECK(in.layer_id == layer_, "joint core of layer {} ran layer {}", layer_,
                   in.layer_id);
    std::map<policy::KeepRule, std::set<int64_t>> by_rule;
    for (size_t h = 0; h < rules_.size(); ++h) {
      if (rules_[h] != policy::KeepRule::kWindow)
        by_rule[rules_[h]].insert(static_cast<int64_t>(h));
    }
    at::Tensor out = keep_rule_method(policy::KeepRule::kWindow).attend(context_, in, levels_, {});
    const auto kv = static_cast<int64_t>(levels_.size());
    for (const auto& [rule, heads] : by_rule) {
      const at::Tensor run = keep_rule_method(rule).attend(context_, in, levels_, heads);
      for (int64_t h : heads) copy_head(out, run, h, kv);
    }
    return out;
  }

 private:
  const KeepRuleContext& context_;
  int64_t layer_;
  std::vector<int64_t> levels_;
  std::vector<policy::KeepRule> rules_;
};

std::string decision_label(const std::vector<int64_t>& levels,
                           const std::vector<policy::KeepRule>& rules) {
  std::string out;
  for (size_t h = 0; h < levels.size(); ++h) {
    out += fmt::format("{}{}{}", h == 0 ? "" : ",", window_label(levels[h]),
                       rules[h] == policy::KeepRule::kWindow ? "" : ":" + rules[h].name());
  }
  return "[" + out + "]";
}

// Layer i of `model` over the stream, through `core`.
void run_layer(arch::DecoderModel& model, ActivationStream& stream, int64_t i,
               arch::AttentionCore& core) {
  const arch::LayerKind kind = model.spec().layer(i).kind;
  stream.apply([&](const at::Tensor& h) {
    return checked_finite(model.run_layer(i, h, {&core, nullptr, 0}), i, kind);
  });
}

// Layer i over the stream as a measure sees the layers below the one it measures: a global layer
// at `levels`' windows under `rules` (every head a window when `rules` is empty) when conditioned,
// every other layer at full KV. Step 1 runs the walk's windows; step 3's check the decision's.
void run_conditioned(arch::DecoderModel& model, ActivationStream& stream, int64_t i,
                     const KeepRuleContext& context, const Windows& levels,
                     const std::map<int64_t, std::vector<policy::KeepRule>>& rules,
                     bool conditioned, arch::AttentionCore& exact) {
  if (model.spec().layer(i).is_global() && conditioned) {
    const auto& base = levels.at(i);
    JointCore core(context, i, base,
                   rules.empty()
                       ? std::vector<policy::KeepRule>(base.size(), policy::KeepRule::kWindow)
                       : rules.at(i));
    run_layer(model, stream, i, core);
  } else {
    run_layer(model, stream, i, exact);
  }
}

// A layer as a whole, in one batch on its span site: {at the walk's windows, under `core` (every
// head at its rule and level at once)}.
std::pair<double, double> walk_and_chosen(const KeepRuleOptions& o, const SpanSite& site,
                                          JointCore& core, const std::vector<int64_t>& walk,
                                          const std::string& label) {
  SpanOutputs chosen;
  for (const auto& in : site.attention) {
    const at::Tensor all = core.attend(in);
    chosen.push_back(all.slice(1, all.size(1) - site.input.front().size(1), all.size(1)));
  }
  const auto values = o.span->evaluate(site, {site.compose(walk), chosen}, label);
  return {values[0], values[1]};
}

// Step 3's check: each layer of `layers` at `decision` and at the walk's windows, measured in one
// batch on the stream the decision produces (the layers below at their chosen rules and levels
// when conditioned), as SeqCalib measures every layer on the stream of the decisions below it. On
// step 1's stream (the layers below at the walk's windows) a layer's selecting heads can win
// against windows that the layers below, once changed, no longer need (seen on
// tiny-qwen3-next-8k with a follow-up: 0.0122 against 0.0503 there, 0.00863 against 0.0081 on
// the decision's stream).
std::map<int64_t, JointCheck> check_layers(arch::DecoderModel& model,
                                           const std::vector<std::vector<int64_t>>& sequences,
                                           const KeepRuleOptions& o, const KeepRuleContext& context,
                                           const Windows& walk, const Decision& decision,
                                           const std::set<int64_t>& layers) {
  const arch::ModelSpec& spec = model.spec();
  arch::ExactAttentionCore exact(context.attention_chunk);
  std::map<int64_t, JointCheck> out;
  ActivationStream stream(model, sequences, o.micro_batch, o.activations);
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    model.prefetch_layer(i + 1);
    if (layers.contains(i)) {
      const SpanSite site = o.span->capture(i, stream, /*keep_attention=*/true);
      JointCore core(context, i, decision.windows.at(i), decision.rules.at(i));
      const auto [at_walk, chosen] =
          walk_and_chosen(o, site, core, walk.at(i), fmt::format("layer {}: joint check", i));
      out[i] = {chosen, at_walk};
    }
    run_conditioned(model, stream, i, context, decision.windows, decision.rules, o.conditioned,
                    exact);
    model.release_layer(i);
  }
  return out;
}

}  // namespace

bool offered_at_every_level(const std::vector<policy::KeepRule>& rules) {
  return std::any_of(rules.begin(), rules.end(), [](const policy::KeepRule& rule) {
    return rule != policy::KeepRule::kWindow && keep_rule_method(rule).offered_at_every_level();
  });
}

KeepRuleResult choose_keep_rules_jointly(arch::DecoderModel& model,
                                         const std::vector<std::vector<int64_t>>& sequences,
                                         const Windows& windows, const KeepRuleOptions& o,
                                         const KeepRuleContext& context) {
  const auto start = std::chrono::steady_clock::now();
  const arch::ModelSpec& spec = model.spec();
  if (o.span == nullptr) {
    throw_field_error("keep_rules",
                      ": {} is chosen jointly with the windows on the answer span; use a span "
                      "measure (answer-tv-span or answer-kl-span)",
                      "snap");
  }
  std::vector<int64_t> global;
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    if (spec.layer(i).is_global()) global.push_back(i);
  }
  if (o.prefill_peak > 0) joint::refuse_peak_bound_beyond_limit(global.size());
  const auto tokens = static_cast<int64_t>(sequences.front().size());
  arch::ExactAttentionCore exact(context.attention_chunk);
  const joint::PeakBound peak = joint::peak_bound(spec, windows, o);

  // Step 1: every head's options, layer by layer, the stream at the walk's windows.
  std::vector<LayerOptions> measured;
  {
    ActivationStream stream(model, sequences, o.micro_batch, o.activations);
    for (int64_t i = 0; i < spec.num_layers(); ++i) {
      model.prefetch_layer(i + 1);
      if (spec.layer(i).is_global()) {
        const SpanSite site = o.span->capture(i, stream, /*keep_attention=*/true);
        measured.push_back(measure_layer(context, o, site, windows.at(i), tokens));
      }
      run_conditioned(model, stream, i, context, windows, {}, o.conditioned, exact);
      model.release_layer(i);
    }
  }

  // Steps 2 to 4: the exact solve, repaired where a layer measures worse as a whole, then the
  // bytes it leaves spent where the measure cannot tell.
  const int64_t fixed = memory::fixed_bytes(spec, o.memory);
  std::map<int64_t, JointCheck> checks;
  std::set<int64_t> kept;
  int64_t check_evaluations = 0;
  const joint::JointMeasure measure = [&](const Decision& d, const std::set<int64_t>& layers) {
    check_evaluations += 2 * static_cast<int64_t>(layers.size());
    const auto values = check_layers(model, sequences, o, context, windows, d, layers);
    for (const auto& [l, check] : values) {
      const std::vector walk_rules(windows.at(l).size(), policy::KeepRule::kWindow);
      spdlog::info(
          "layer {}: joint check {} measures {:.6g} as a whole, the walk's windows {} "
          "{:.6g}",
          l, decision_label(d.windows.at(l), d.rules.at(l)), check.chosen,
          decision_label(windows.at(l), walk_rules), check.walk);
    }
    return values;
  };
  const Decision solved = joint::solve_and_repair(spec, measured, o.budget_bytes - fixed, o.memory,
                                                  windows, measure, checks, kept, peak);
  const Decision decision =
      joint::spend_leftover(spec, measured, solved, kept, o.budget_bytes, o.memory, peak);
  const std::set<int64_t> selecting = joint::selecting_layers(decision);
  const auto bytes_of = [&](const Decision& d) { return joint::decision_bytes(spec, d, o.memory); };
  KeepRuleResult result;
  result.windows = windows;
  for (const auto& layer : measured) {
    const int64_t l = layer.layer;
    result.windows[l] = decision.windows.at(l);
    result.rules[l] = decision.rules.at(l);
    const std::vector walk_rules(windows.at(l).size(), policy::KeepRule::kWindow);
    if (kept.contains(l)) {
      spdlog::info(
          "layer {}: repaired: measured worse as a whole than the walk's windows "
          "({:.6g} against {:.6g}), which it keeps",
          l, checks.at(l).chosen, checks.at(l).walk);
    }
    spdlog::info("layer {}: joint keep rules {} (the walk's windows {})", l,
                 decision_label(decision.windows.at(l), decision.rules.at(l)),
                 decision_label(windows.at(l), walk_rules));
  }
  const int64_t total = bytes_of(decision);
  HEADWISE_CHECK(total <= o.budget_bytes, "keep rules: the joint choice is over the budget");
  if (peak.active())
    result.prefill_peak =
        joint::checked_peak(spec, decision.windows, decision.rules, o.memory, peak);
  for (const auto& layer : measured) result.evaluations += layer.evaluations;
  result.evaluations += check_evaluations;
  spdlog::info(
      "keep rules: joint solve {} bytes, {} layer(s) repaired, {} bytes after spending "
      "the leftover (tolerance {} of a layer's measure), of {}",
      bytes_of(solved), kept.size(), total, joint::kSpendTolerance, o.budget_bytes);

  // Step 3: the decision measured, layer by layer, on the stream it produces.
  ActivationStream stream(model, sequences, o.micro_batch, o.activations);
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    model.prefetch_layer(i + 1);
    if (!spec.layer(i).is_global()) {
      run_layer(model, stream, i, exact);
      model.release_layer(i);
      continue;
    }
    const SpanSite site = o.span->capture(i, stream, /*keep_attention=*/true);
    JointCore core(context, i, result.windows.at(i), result.rules.at(i));
    const auto [at_walk, chosen] =
        walk_and_chosen(o, site, core, windows.at(i), fmt::format("layer {}: joint keep rules", i));
    result.evaluations += 2;
    KeepRuleLayer report;
    report.layer_id = i;
    for (int64_t h = 0; h < static_cast<int64_t>(windows.at(i).size()); ++h)
      report.candidates.push_back(h);
    report.divergence_windows = at_walk;
    report.divergence_chosen = chosen;
    if (selecting.contains(i)) {
      report.selection_bytes =
          memory::selection_bytes(*spec.layer(i).attention, result.windows.at(i), o.memory);
    }
    if (checks.contains(i)) {
      report.joint_chosen = checks.at(i).chosen;
      report.joint_walk = checks.at(i).walk;
      report.repaired = kept.contains(i);
    }
    result.layers.push_back(report);
    if (o.conditioned) {
      run_layer(model, stream, i, core);
    } else {
      run_layer(model, stream, i, exact);
    }
    model.release_layer(i);
  }
  result.divergence_final = o.span->evaluate_final(stream);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace headwise::calib

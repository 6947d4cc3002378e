// The joint keep-rule pass: every head's rule and level chosen together (joint_rules.hpp).
#include "calib/rules/joint_rules.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "calib/rules/layer_trials.hpp"
#include "calib/walk/finite_checks.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib {
namespace {

using Windows = std::map<int64_t, std::vector<int64_t>>;

using joint::Decision;
using joint::HeadOption;
using joint::JointCheck;
using joint::LayerOptions;
using trials::copy_head;

// 2^G sets of selecting layers are solved: at most 4096.
constexpr size_t kMaxJointLayers = 12;

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

// Bytes of one head's option; with `selecting`, its exact share of the layer's bookkeeping
// (memory::selection_bytes: 12 B per slot and 24 B per head, times batch).
int64_t option_bytes(const arch::AttentionShape& attention, int64_t level, bool selecting,
                     const memory::MemoryOptions& memory) {
  int64_t bytes = memory::head_bytes(attention, level, memory);
  if (selecting) {
    const int64_t kv = attention.num_kv_heads;
    const std::vector<int64_t> every_head(static_cast<size_t>(kv), level);
    bytes += memory::selection_bytes(attention, every_head, memory) / kv;  // divides exactly
  }
  return bytes;
}

// The solver's groups with the layers of `mask` selecting and the layers of `kept` at the walk's
// windows. A group's options are ordered so that the solver's tie rule (the larger `window` wins)
// prefers keeping recent tokens, then more slots: the rule options first, then the window options,
// `window` the index.
std::vector<solve::Group> groups_for(const arch::ModelSpec& spec,
                                     const std::vector<LayerOptions>& layers, size_t mask,
                                     const memory::MemoryOptions& memory, const Windows& walk,
                                     const std::set<int64_t>& kept,
                                     std::vector<std::vector<size_t>>& index) {
  std::vector<solve::Group> groups;
  index.clear();
  for (size_t l = 0; l < layers.size(); ++l) {
    const bool selecting = (mask >> l) & 1U;
    const bool pinned = kept.contains(layers[l].layer);
    const auto& attention = *spec.layer(layers[l].layer).attention;
    for (size_t h = 0; h < layers[l].heads.size(); ++h) {
      const auto& options = layers[l].heads[h];
      solve::Group group;
      group.layer_id = layers[l].layer;
      group.kv_head = static_cast<int64_t>(h);
      std::vector<size_t> order;
      for (bool window_pass : {false, true}) {
        for (size_t i = 0; i < options.size(); ++i) {
          const bool window = options[i].rule == policy::KeepRule::kWindow;
          if (window != window_pass || (!window && !selecting)) continue;
          if (pinned && options[i].level != walk.at(layers[l].layer)[h]) continue;
          order.push_back(i);
        }
      }
      for (size_t i : order) {
        group.options.push_back({static_cast<int64_t>(group.options.size()),
                                 option_bytes(attention, options[i].level, selecting, memory),
                                 options[i].divergence});
      }
      index.push_back(std::move(order));
      groups.push_back(std::move(group));
    }
  }
  return groups;
}

// Per group of groups_for, per option: whether it is a snap head's (it stages the prompt).
std::vector<std::vector<bool>> snap_options(const std::vector<LayerOptions>& layers,
                                            const std::vector<std::vector<size_t>>& index) {
  std::vector<std::vector<bool>> out;
  size_t g = 0;
  for (const auto& layer : layers) {
    for (const auto& options : layer.heads) {
      out.emplace_back();
      for (size_t i : index[g++]) out.back().push_back(options[i].rule == policy::KeepRule::kSnap);
    }
  }
  return out;
}

// The decision that picks option `option[l][h]` of every head.
Decision decision_of(const std::vector<LayerOptions>& layers,
                     std::vector<std::vector<size_t>> option) {
  Decision out;
  for (size_t l = 0; l < layers.size(); ++l) {
    std::vector<int64_t> levels;
    std::vector<policy::KeepRule> rules;
    for (size_t h = 0; h < layers[l].heads.size(); ++h) {
      const HeadOption& chosen = layers[l].heads[h][option[l][h]];
      levels.push_back(chosen.level);
      rules.push_back(chosen.rule);
    }
    out.windows[layers[l].layer] = levels;
    out.rules[layers[l].layer] = rules;
  }
  out.option = std::move(option);
  return out;
}

// Whether layer l of `decision` is the walk's: every head a window at the walk's level.
bool at_walk(const Decision& decision, int64_t layer, const Windows& walk) {
  const auto& rules = decision.rules.at(layer);
  return decision.windows.at(layer) == walk.at(layer) &&
         std::all_of(rules.begin(), rules.end(),
                     [](const policy::KeepRule& r) { return r == policy::KeepRule::kWindow; });
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

namespace joint {

std::set<int64_t> selecting_layers(const std::map<int64_t, std::vector<policy::KeepRule>>& rules) {
  std::set<int64_t> out;
  for (const auto& [layer, heads] : rules) {
    for (const auto& rule : heads) {
      if (rule != policy::KeepRule::kWindow) out.insert(layer);
    }
  }
  return out;
}

std::set<int64_t> selecting_layers(const Decision& decision) {
  return selecting_layers(decision.rules);
}

int64_t decision_bytes(const arch::ModelSpec& spec, const Decision& decision,
                       const memory::MemoryOptions& memory) {
  return memory::estimate(spec, decision.windows, memory, selecting_layers(decision)).total_bytes;
}

Decision solve(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers, int64_t budget,
               const memory::MemoryOptions& memory, const Windows& walk,
               const std::set<int64_t>& kept, const PeakBound& peak) {
  HEADWISE_CHECK(layers.size() <= kMaxJointLayers, "keep rules: {} global layers is over {}",
                 layers.size(), kMaxJointLayers);
  // Fewer selecting layers first, so that on a tie the first (fewest) set stays. A kept layer
  // selects nothing.
  size_t kept_mask = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (kept.contains(layers[l].layer)) kept_mask |= size_t{1} << l;
  }
  std::vector<size_t> masks;
  for (size_t m = 0; m < (size_t{1} << layers.size()); ++m) {
    if ((m & kept_mask) == 0) masks.push_back(m);
  }
  std::stable_sort(masks.begin(), masks.end(),
                   [](size_t a, size_t b) { return std::popcount(a) < std::popcount(b); });
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::vector<size_t>> best_option;
  for (size_t mask : masks) {
    std::vector<std::vector<size_t>> index;
    const auto groups = groups_for(spec, layers, mask, memory, walk, kept, index);
    if (solve::min_total_bytes(groups) > budget) continue;
    const solve::SolveResult r = solve::solve_exact(groups, budget);
    std::optional<BoundedChoice> within =
        BoundedChoice{r.choice, r.total_distortion, r.total_bytes, 0};
    if (peak.active()) {
      const auto staged = staged_groups(spec, groups, snap_options(layers, index), memory, peak);
      within = keep_within_peak(staged, r, budget, peak.bytes - memory::fixed_bytes(spec, memory),
                                peak.schedule, best);
    }
    if (!within || !(within->distortion < best)) continue;
    best = within->distortion;
    best_option.clear();
    size_t g = 0;
    for (const auto& layer : layers) {
      best_option.emplace_back();
      for (size_t h = 0; h < layer.heads.size(); ++h, ++g)
        best_option.back().push_back(index[g][within->choice[g]]);
    }
  }
  HEADWISE_CHECK(std::isfinite(best), "keep rules: no joint choice fits the budget");
  spdlog::debug("keep rules: joint solve over {} sets of selecting layers", masks.size());
  return decision_of(layers, std::move(best_option));
}

Decision solve_and_repair(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers,
                          int64_t budget, const memory::MemoryOptions& memory, const Windows& walk,
                          const JointMeasure& measure, std::map<int64_t, JointCheck>& checks,
                          std::set<int64_t>& kept, const PeakBound& peak) {
  // Each round keeps at least one more layer at the walk's windows or returns: at most G + 1.
  for (;;) {
    Decision decision = solve(spec, layers, budget, memory, walk, kept, peak);
    std::set<int64_t> changed;
    for (const auto& layer : layers) {
      if (!kept.contains(layer.layer) && !at_walk(decision, layer.layer, walk))
        changed.insert(layer.layer);
    }
    // A check from an earlier round describes an assignment the decision no longer has.
    std::erase_if(checks, [&](const auto& c) { return !kept.contains(c.first); });
    if (changed.empty()) return decision;
    bool repaired = false;
    for (const auto& [layer, check] : measure(decision, changed)) {
      checks[layer] = check;
      if (check.chosen > check.walk) {
        kept.insert(layer);
        repaired = true;
      }
    }
    if (!repaired) return decision;
  }
}

Decision spend_leftover(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers,
                        const Decision& decision, const std::set<int64_t>& kept, int64_t budget,
                        const memory::MemoryOptions& memory, const PeakBound& peak) {
  const auto bytes_of = [&](const Decision& d) { return decision_bytes(spec, d, memory); };
  const auto within_peak = [&](const Decision& d) {
    return !peak.active() || policy_peak(spec, d.windows, d.rules, memory, peak) <= peak.bytes;
  };
  HEADWISE_CHECK(bytes_of(decision) <= budget, "keep rules: the joint choice is over the budget");
  HEADWISE_CHECK(within_peak(decision), "keep rules: the joint choice is over --prefill-peak");
  Decision out = decision;
  struct Upgrade {
    double increase = 0.0;
    size_t layer = 0, head = 0;
    int64_t bytes = 0;
    size_t option = 0;
  };
  for (;;) {
    std::vector<Upgrade> upgrades;
    for (size_t l = 0; l < layers.size(); ++l) {
      if (kept.contains(layers[l].layer)) continue;
      const auto& attention = *spec.layer(layers[l].layer).attention;
      const double tolerance = kSpendTolerance * layers[l].base;
      for (size_t h = 0; h < layers[l].heads.size(); ++h) {
        const auto& options = layers[l].heads[h];
        const HeadOption& solved = options[decision.option[l][h]];
        const int64_t now = memory::head_bytes(attention, options[out.option[l][h]].level, memory);
        for (size_t i = 0; i < options.size(); ++i) {
          const int64_t bytes = memory::head_bytes(attention, options[i].level, memory);
          const double increase = options[i].divergence - solved.divergence;
          if (bytes > now && increase <= tolerance) upgrades.push_back({increase, l, h, bytes, i});
        }
      }
    }
    std::sort(upgrades.begin(), upgrades.end(), [](const Upgrade& a, const Upgrade& b) {
      return std::tie(a.increase, a.layer, a.head, a.bytes, a.option) <
             std::tie(b.increase, b.layer, b.head, b.bytes, b.option);
    });
    bool spent = false;
    for (const Upgrade& u : upgrades) {
      auto option = out.option;
      option[u.layer][u.head] = u.option;
      Decision next = decision_of(layers, std::move(option));
      if (bytes_of(next) > budget || !within_peak(next)) continue;
      out = std::move(next);
      spent = true;
      break;
    }
    if (!spent) return out;
  }
}

}  // namespace joint

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
  if (global.size() > kMaxJointLayers) {
    throw_field_error("keep_rules",
                      ": snap's joint solve tries every set of selecting layers; {} global layers "
                      "is over {}",
                      global.size(), kMaxJointLayers);
  }
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

// The joint keep-rule pass: every head's rule and level chosen together (joint_rules.hpp).
#include "calib/rules/joint_rules.hpp"

#include <spdlog/spdlog.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <limits>

#include "calib/walk/finite_checks.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib {
namespace {

using Windows = std::map<int64_t, std::vector<int64_t>>;

// One option of one head: its rule at a level, and the span measure with only this head moved.
struct HeadOption {
  policy::KeepRule rule;
  int64_t level = 0;
  double divergence = 0.0;
};

// A global layer's measured options, per KV head.
struct LayerOptions {
  int64_t layer = 0;
  double base = 0.0;  // every head at the walk's window
  std::vector<std::vector<HeadOption>> heads;
  int64_t evaluations = 0;  // candidates measured
};

// 2^G sets of selecting layers are solved: at most 4096.
constexpr size_t kMaxJointLayers = 12;

// Heads [h*group, (h+1)*group) of `from` into `into` ([batch, tokens, heads, head_dim]).
void copy_head(at::Tensor& into, const at::Tensor& from, int64_t h, int64_t kv_heads) {
  const int64_t group = from.size(2) / kv_heads;
  into.slice(2, h * group, (h + 1) * group).copy_(from.slice(2, h * group, (h + 1) * group));
}

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

struct JointChoice {
  std::set<int64_t> selecting;  // layers with a selecting head
  std::vector<size_t> option;   // per head (layer order, head order): its option index
  int64_t global_bytes = 0;     // the heads' bytes and the bookkeeping
  double distortion = std::numeric_limits<double>::infinity();
  int64_t layer_sets = 0;  // sets of selecting layers solved
};

// The solver's groups with the layers of `mask` selecting. A group's options are ordered so that
// the solver's tie rule (the larger `window` wins) prefers keeping recent tokens, then more slots:
// the rule options first, then the window options, `window` the index.
std::vector<solve::Group> groups_for(const arch::ModelSpec& spec,
                                     const std::vector<LayerOptions>& layers, size_t mask,
                                     const memory::MemoryOptions& memory,
                                     std::vector<std::vector<size_t>>& index) {
  std::vector<solve::Group> groups;
  index.clear();
  for (size_t l = 0; l < layers.size(); ++l) {
    const bool selecting = (mask >> l) & 1U;
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

// Step 2: the least total over every set of selecting layers.
JointChoice solve_jointly(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers,
                          int64_t global_budget, const memory::MemoryOptions& memory) {
  JointChoice best;
  // Fewer selecting layers first, so that on a tie the first (fewest) set stays.
  std::vector<size_t> masks(size_t{1} << layers.size());
  for (size_t m = 0; m < masks.size(); ++m) masks[m] = m;
  std::stable_sort(masks.begin(), masks.end(),
                   [](size_t a, size_t b) { return std::popcount(a) < std::popcount(b); });
  for (size_t mask : masks) {
    std::vector<std::vector<size_t>> index;
    const auto groups = groups_for(spec, layers, mask, memory, index);
    ++best.layer_sets;
    if (solve::min_total_bytes(groups) > global_budget) continue;
    const solve::SolveResult r = solve::solve_exact(groups, global_budget);
    if (!(r.total_distortion < best.distortion)) continue;
    best.distortion = r.total_distortion;
    best.global_bytes = r.total_bytes;
    best.option.clear();
    best.selecting.clear();
    for (size_t g = 0; g < groups.size(); ++g) best.option.push_back(index[g][r.choice[g]]);
    for (size_t l = 0; l < layers.size(); ++l) {
      if ((mask >> l) & 1U) best.selecting.insert(layers[l].layer);
    }
  }
  HEADWISE_CHECK(std::isfinite(best.distortion), "keep rules: no joint choice fits the budget");
  return best;
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
  if (global.size() > kMaxJointLayers) {
    throw_field_error("keep_rules",
                      ": snap's joint solve tries every set of selecting layers; {} global layers "
                      "is over {}",
                      global.size(), kMaxJointLayers);
  }
  const auto tokens = static_cast<int64_t>(sequences.front().size());
  arch::ExactAttentionCore exact(context.attention_chunk);
  const auto run_layer = [&](ActivationStream& stream, int64_t i, arch::AttentionCore& core) {
    stream.apply([&](const at::Tensor& h) {
      return checked_finite(model.run_layer(i, h, {&core, nullptr, 0}), i, spec.layer(i).kind);
    });
  };

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
      if (spec.layer(i).is_global() && o.conditioned) {
        const auto& base = windows.at(i);
        JointCore core(context, i, base,
                       std::vector<policy::KeepRule>(base.size(), policy::KeepRule::kWindow));
        run_layer(stream, i, core);
      } else {
        run_layer(stream, i, exact);
      }
      model.release_layer(i);
    }
  }

  // Step 2: the exact solve.
  const int64_t fixed = memory::fixed_bytes(spec, o.memory);
  const JointChoice choice = solve_jointly(spec, measured, o.budget_bytes - fixed, o.memory);
  KeepRuleResult result;
  result.windows = windows;
  size_t g = 0;
  std::set<int64_t> selecting;
  for (const auto& layer : measured) {
    std::vector<int64_t> levels;
    std::vector<policy::KeepRule> rules;
    for (const auto& options : layer.heads) {
      const HeadOption& chosen = options[choice.option[g++]];
      levels.push_back(chosen.level);
      rules.push_back(chosen.rule);
      if (chosen.rule != policy::KeepRule::kWindow) selecting.insert(layer.layer);
    }
    result.windows[layer.layer] = levels;
    result.rules[layer.layer] = rules;
    spdlog::info("layer {}: joint keep rules {} (the walk's windows {})", layer.layer,
                 decision_label(levels, rules),
                 decision_label(windows.at(layer.layer),
                                std::vector(levels.size(), policy::KeepRule::kWindow)));
  }
  // A set whose layer ended with no selecting head paid for bookkeeping it does not hold: the
  // policy holds only the layers that select, so its bytes are the solve's or fewer.
  const int64_t total = memory::estimate(spec, result.windows, o.memory, selecting).total_bytes;
  HEADWISE_CHECK(total <= o.budget_bytes, "keep rules: the joint choice is over the budget");
  HEADWISE_CHECK(selecting != choice.selecting || total == fixed + choice.global_bytes,
                 "keep rules: the policy's bytes {} are not the solve's {}", total,
                 fixed + choice.global_bytes);
  for (const auto& layer : measured) result.evaluations += layer.evaluations;
  spdlog::info("keep rules: joint solve over {} sets of selecting layers: {} bytes of {}",
               choice.layer_sets, total, o.budget_bytes);

  // Step 3: the decision measured, layer by layer, on the stream it produces.
  ActivationStream stream(model, sequences, o.micro_batch, o.activations);
  for (int64_t i = 0; i < spec.num_layers(); ++i) {
    model.prefetch_layer(i + 1);
    if (!spec.layer(i).is_global()) {
      run_layer(stream, i, exact);
      model.release_layer(i);
      continue;
    }
    const SpanSite site = o.span->capture(i, stream, /*keep_attention=*/true);
    JointCore core(context, i, result.windows.at(i), result.rules.at(i));
    SpanOutputs chosen;
    for (const auto& in : site.attention) {
      const at::Tensor all = core.attend(in);
      chosen.push_back(all.slice(1, all.size(1) - site.input.front().size(1), all.size(1)));
    }
    const auto values = o.span->evaluate(site, {site.compose(windows.at(i)), chosen},
                                         fmt::format("layer {}: joint keep rules", i));
    result.evaluations += 2;
    KeepRuleLayer report;
    report.layer_id = i;
    for (int64_t h = 0; h < static_cast<int64_t>(windows.at(i).size()); ++h)
      report.candidates.push_back(h);
    report.divergence_windows = values[0];
    report.divergence_chosen = values[1];
    if (selecting.contains(i)) {
      report.selection_bytes =
          memory::selection_bytes(*spec.layer(i).attention, result.windows.at(i), o.memory);
    }
    result.layers.push_back(report);
    if (o.conditioned) {
      run_layer(stream, i, core);
    } else {
      run_layer(stream, i, exact);
    }
    model.release_layer(i);
  }
  result.divergence_final = o.span->evaluate_final(stream);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace headwise::calib

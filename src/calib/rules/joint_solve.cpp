// The joint keep-rule pass's solve (joint_rules.hpp, steps 2 and 4): the heads' measured options
// priced exactly in bytes, chosen together over the layers within the budget (and the prefill peak
// when bounded), the repair's re-solves, and the leftover spent. No model runs here.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>

#include "calib/rules/joint_rules.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib {
namespace {

using Windows = std::map<int64_t, std::vector<int64_t>>;

using joint::Decision;
using joint::HeadOption;
using joint::LayerOptions;

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
                                     const std::vector<LayerOptions>& layers,
                                     const std::vector<bool>& selecting_layers,
                                     const memory::MemoryOptions& memory, const Windows& walk,
                                     const std::set<int64_t>& kept,
                                     std::vector<std::vector<size_t>>& index) {
  std::vector<solve::Group> groups;
  index.clear();
  for (size_t l = 0; l < layers.size(); ++l) {
    const bool selecting = selecting_layers[l];
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

}  // namespace

namespace joint {

void refuse_peak_bound_beyond_limit(size_t global_layers) {
  if (global_layers <= kMaxPeakBoundLayers) return;
  throw_field_error("prefill_peak",
                    ": the bounded joint solve tries every set of selecting layers, and {} global "
                    "layers is over {} (without {} the solve has no such limit)",
                    global_layers, kMaxPeakBoundLayers, field_ref("prefill_peak"));
}

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

namespace {

// One global layer's heads together under one regime (a selecting layer pays the bookkeeping and
// may select; the other holds windows only): an assignment of an option to every head.
struct LayerAssignment {
  int64_t bytes = 0;
  double distortion = 0.0;     // summed over the heads, in head order
  std::vector<size_t> option;  // per head, its index in LayerOptions
  bool selecting = false;      // the layer pays the bookkeeping
};

// A solve's choice over groups_for's groups (one per head, layer by layer) as each head's index
// in LayerOptions, per layer.
std::vector<std::vector<size_t>> chosen_options(const std::vector<LayerOptions>& layers,
                                                const std::vector<std::vector<size_t>>& index,
                                                const std::vector<size_t>& choice) {
  std::vector<std::vector<size_t>> option;
  size_t g = 0;
  for (const auto& layer : layers) {
    option.emplace_back();
    for (size_t h = 0; h < layer.heads.size(); ++h, ++g)
      option.back().push_back(index[g][choice[g]]);
  }
  return option;
}

// The heads' options solved exactly with the layers of `selecting` paying the bookkeeping (one set
// of the enumeration).
Decision solve_selecting(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers,
                         const std::vector<bool>& selecting, int64_t budget,
                         const memory::MemoryOptions& memory, const Windows& walk,
                         const std::set<int64_t>& kept) {
  std::vector<std::vector<size_t>> index;
  const auto groups = groups_for(spec, layers, selecting, memory, walk, kept, index);
  return decision_of(layers,
                     chosen_options(layers, index, solve::solve_exact(groups, budget).choice));
}

// Of `states`, those whose distortion is below that of every state with fewer or as many bytes:
// the least distortion at each byte count that buys a decrease. Exact under one budget: whatever
// completes a dropped state completes the state that dominates it within the same bytes. On an
// exact tie the state listed first stays (stable).
void keep_pareto(std::vector<LayerAssignment>& states) {
  std::stable_sort(states.begin(), states.end(),
                   [](const LayerAssignment& a, const LayerAssignment& b) {
                     if (a.bytes != b.bytes) return a.bytes < b.bytes;
                     return a.distortion < b.distortion;
                   });
  std::vector<LayerAssignment> kept;
  for (auto& state : states) {
    if (kept.empty() || state.distortion < kept.back().distortion) kept.push_back(std::move(state));
  }
  states = std::move(kept);
}

// Every Pareto-optimal assignment of one layer under one regime, by a DP over its heads (the
// frontier after each head), with the solver's groups for that layer alone (groups_for).
std::vector<LayerAssignment> layer_frontier(const arch::ModelSpec& spec, const LayerOptions& layer,
                                            bool selecting, const memory::MemoryOptions& memory,
                                            const Windows& walk, const std::set<int64_t>& kept) {
  std::vector<std::vector<size_t>> index;
  const auto groups = groups_for(spec, {layer}, {selecting}, memory, walk, kept, index);
  std::vector<LayerAssignment> states{LayerAssignment{}};
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<LayerAssignment> next;
    for (const auto& state : states) {
      // The later option first: on an exact tie it stays, as the solver's rule keeps the larger
      // `window` (groups_for's order: the rules, then the windows by level).
      for (size_t i = groups[g].options.size(); i-- > 0;) {
        const solve::Option& o = groups[g].options[i];
        LayerAssignment grown{state.bytes + o.bytes, state.distortion + o.distortion, state.option,
                              selecting};
        grown.option.push_back(index[g][i]);
        next.push_back(std::move(grown));
      }
    }
    keep_pareto(next);
    states = std::move(next);
  }
  return states;
}

// Without a peak bound: each layer becomes one group whose options are its Pareto-optimal
// assignments under both regimes (a layer in `kept` only at the walk's windows), and one exact
// solve over the G groups chooses them together. Below full KV's bytes, the same optimum as
// solving every set of selecting layers (a set fixes each layer's regime; this lets each layer take
// either), in one solve instead of 2^G, so it has no limit on G.
Decision solve_by_layer_frontiers(const arch::ModelSpec& spec,
                                  const std::vector<LayerOptions>& layers, int64_t budget,
                                  const memory::MemoryOptions& memory, const Windows& walk,
                                  const std::set<int64_t>& kept) {
  {
    // Full KV fits (every head at its largest window, the kept layers at the walk's): that is the
    // decision, as the walk's solver gives it, not a selecting layer that measures lower within
    // the measure's noise.
    std::vector<std::vector<size_t>> index;
    const std::vector<bool> none(layers.size(), false);
    const auto windows_only = groups_for(spec, layers, none, memory, walk, kept, index);
    if (budget >= solve::max_window_total_bytes(windows_only)) {
      return decision_of(
          layers, chosen_options(layers, index, solve::solve_exact(windows_only, budget).choice));
    }
  }
  std::vector<solve::Group> groups;
  std::vector<std::vector<LayerAssignment>> assignments;
  for (const auto& layer : layers) {
    // The regime without selection first: on an exact tie the layer that selects nothing stays,
    // as the sets of selecting layers were tried fewest first.
    std::vector<LayerAssignment> both = layer_frontier(spec, layer, false, memory, walk, kept);
    if (!kept.contains(layer.layer)) {
      for (auto& a : layer_frontier(spec, layer, true, memory, walk, kept))
        both.push_back(std::move(a));
    }
    keep_pareto(both);
    solve::Group group;
    group.layer_id = layer.layer;
    for (size_t k = 0; k < both.size(); ++k)
      group.options.push_back({static_cast<int64_t>(k), both[k].bytes, both[k].distortion});
    groups.push_back(std::move(group));
    assignments.push_back(std::move(both));
  }
  HEADWISE_CHECK(solve::min_total_bytes(groups) <= budget,
                 "keep rules: no joint choice fits the budget");
  const solve::SolveResult r = solve::solve_exact(groups, budget);
  std::vector<bool> selecting;
  for (size_t l = 0; l < layers.size(); ++l)
    selecting.push_back(assignments[l][r.choice[l]].selecting);
  spdlog::debug(
      "keep rules: joint solve over {} layers' frontiers ({} assignments)", layers.size(),
      std::accumulate(groups.begin(), groups.end(), size_t{0},
                      [](size_t n, const solve::Group& g) { return n + g.options.size(); }));
  // The heads again under the layers' chosen regimes, as the enumeration solves a set: the same
  // optimum (this set's least is no more than the frontiers' choice, which it contains, and no
  // less than the least of all), with the head solver's rules on ties (its larger window, its
  // free upgrades) that a layer's frontier does not keep.
  return solve_selecting(spec, layers, selecting, budget, memory, walk, kept);
}

}  // namespace

Decision solve(const arch::ModelSpec& spec, const std::vector<LayerOptions>& layers, int64_t budget,
               const memory::MemoryOptions& memory, const Windows& walk,
               const std::set<int64_t>& kept, const PeakBound& peak) {
  if (!peak.active()) return solve_by_layer_frontiers(spec, layers, budget, memory, walk, kept);
  return solve_by_selecting_sets(spec, layers, budget, memory, walk, kept, peak);
}

Decision solve_by_selecting_sets(const arch::ModelSpec& spec,
                                 const std::vector<LayerOptions>& layers, int64_t budget,
                                 const memory::MemoryOptions& memory, const Windows& walk,
                                 const std::set<int64_t>& kept, const PeakBound& peak) {
  HEADWISE_CHECK(layers.size() <= joint::kMaxPeakBoundLayers,
                 "keep rules: {} global layers is over {}", layers.size(),
                 joint::kMaxPeakBoundLayers);
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
    std::vector<bool> selecting(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) selecting[l] = ((mask >> l) & 1U) != 0;
    const auto groups = groups_for(spec, layers, selecting, memory, walk, kept, index);
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
    best_option = chosen_options(layers, index, within->choice);
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

}  // namespace headwise::calib

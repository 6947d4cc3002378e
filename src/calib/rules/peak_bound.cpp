// The joint pass's solve under --prefill-peak (peak_bound.hpp).
#include "calib/rules/peak_bound.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "calib/rules/joint_rules.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/prefill_peak.hpp"

namespace headwise::calib::joint {
namespace {

using runtime::PrefillSchedule;

int64_t product(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out))
    throw_field_error("prefill_peak", ": the prompt's staging overflows 64-bit bytes");
  return out;
}

// A partial choice of the heads so far. `done` is what the finished layers stage at once (their
// sum whole prompt, their largest layer by layer), `current` what the layer under way stages.
struct State {
  int64_t bytes = 0;
  int64_t done = 0;
  int64_t current = 0;
  double distortion = 0.0;
  uint32_t parent = 0;
  uint32_t option = 0;
};

int64_t held(const State& s, int64_t staging, PrefillSchedule schedule) {
  return schedule == PrefillSchedule::kWholePrompt ? s.done + s.current + staging
                                                   : std::max(s.done, s.current + staging);
}

// The layer under way is finished: its staging joins the layers done.
void finish_layer(State& s, PrefillSchedule schedule) {
  s.done =
      schedule == PrefillSchedule::kWholePrompt ? s.done + s.current : std::max(s.done, s.current);
  s.current = 0;
}

// Per (done, current), only the states no state with fewer or as many bytes beats on distortion:
// the future of a state depends on nothing else, so a dropped state has a better twin. Sorted, so
// the first of equals stays (the search is deterministic).
void keep_undominated(std::vector<State>& states) {
  std::stable_sort(states.begin(), states.end(), [](const State& a, const State& b) {
    return std::tie(a.done, a.current, a.bytes, a.distortion) <
           std::tie(b.done, b.current, b.bytes, b.distortion);
  });
  std::vector<State> kept;
  for (const State& s : states) {
    if (!kept.empty() && kept.back().done == s.done && kept.back().current == s.current &&
        kept.back().distortion <= s.distortion)
      continue;
    kept.push_back(s);
  }
  states = std::move(kept);
}

}  // namespace

std::vector<StagedGroup> staged_groups(const arch::ModelSpec& spec,
                                       const std::vector<solve::Group>& groups,
                                       const std::vector<std::vector<bool>>& snap,
                                       const memory::MemoryOptions& memory,
                                       const PeakBound& bound) {
  std::vector<StagedGroup> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& attention = *spec.layer(groups[g].layer_id).attention;
    const int64_t staging = product(product(bound.prompt_tokens, memory.batch),
                                    memory::snap_staging_bytes_per_token(attention, memory));
    StagedGroup group{groups[g].layer_id, {}};
    for (size_t k = 0; k < groups[g].options.size(); ++k) {
      const solve::Option& option = groups[g].options[k];
      group.options.push_back({option.bytes, snap[g][k] ? staging : 0, option.distortion});
    }
    out.push_back(std::move(group));
  }
  return out;
}

int64_t staging_at_once(const std::vector<StagedGroup>& groups, const std::vector<size_t>& choice,
                        PrefillSchedule schedule) {
  State s;
  for (size_t g = 0; g < groups.size(); ++g) {
    s.current += groups[g].options[choice[g]].staging;
    if (g + 1 == groups.size() || groups[g + 1].layer != groups[g].layer) finish_layer(s, schedule);
  }
  return s.done;
}

std::optional<BoundedChoice> solve_bounded(const std::vector<StagedGroup>& groups, int64_t budget,
                                           int64_t bound, PrefillSchedule schedule,
                                           double incumbent, size_t max_states) {
  // stages[g + 1]: the states after head g; each points at its parent in stages[g].
  std::vector<std::vector<State>> stages{{State{}}};
  for (size_t g = 0; g < groups.size(); ++g) {
    const bool layer_ends = g + 1 == groups.size() || groups[g + 1].layer != groups[g].layer;
    std::vector<State> next;
    const auto& from = stages.back();
    for (size_t p = 0; p < from.size(); ++p) {
      for (size_t k = 0; k < groups[g].options.size(); ++k) {
        const StagedOption& option = groups[g].options[k];
        State s = from[p];
        if (option.bytes > budget - s.bytes) continue;
        const int64_t at_once = held(s, option.staging, schedule);
        s.bytes += option.bytes;
        if (at_once > bound - s.bytes) continue;  // the prefix's peak only grows
        s.distortion += option.distortion;
        if (!(s.distortion < incumbent)) continue;  // distortions are not negative
        s.current += option.staging;
        s.parent = static_cast<uint32_t>(p);
        s.option = static_cast<uint32_t>(k);
        if (layer_ends) finish_layer(s, schedule);
        next.push_back(s);
      }
    }
    keep_undominated(next);
    if (next.size() > max_states) {
      throw_field_error(
          "prefill_peak",
          ": the bounded solve holds {} states after {} of {} heads, over its limit {}; "
          "calibrate without it",
          next.size(), g + 1, groups.size(), max_states);
    }
    if (next.empty()) return std::nullopt;
    stages.push_back(std::move(next));
  }
  const auto& last = stages.back();
  size_t best = 0;
  for (size_t i = 1; i < last.size(); ++i) {
    if (std::tie(last[i].distortion, last[i].bytes, last[i].done) <
        std::tie(last[best].distortion, last[best].bytes, last[best].done))
      best = i;
  }
  BoundedChoice out;
  out.distortion = last[best].distortion;
  out.bytes = last[best].bytes;
  out.staging = last[best].done;
  out.choice.resize(groups.size());
  size_t at = best;
  for (size_t g = groups.size(); g-- > 0;) {
    out.choice[g] = stages[g + 1][at].option;
    at = stages[g + 1][at].parent;
  }
  return out;
}

std::optional<BoundedChoice> keep_within_peak(const std::vector<StagedGroup>& groups,
                                              const solve::SolveResult& exact, int64_t budget,
                                              int64_t bound, PrefillSchedule schedule,
                                              double incumbent) {
  const int64_t staging = staging_at_once(groups, exact.choice, schedule);
  if (exact.total_bytes <= bound - staging) {
    return BoundedChoice{exact.choice, exact.total_distortion, exact.total_bytes, staging};
  }
  return solve_bounded(groups, budget, bound, schedule, incumbent);
}

int64_t policy_peak(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                    const std::map<int64_t, std::vector<policy::KeepRule>>& rules,
                    const memory::MemoryOptions& memory, const PeakBound& bound) {
  memory::SnapHeads snap;
  for (const auto& [layer, heads] : rules) {
    for (size_t h = 0; h < heads.size(); ++h) {
      if (heads[h] == policy::KeepRule::kSnap) snap.insert({layer, static_cast<int64_t>(h)});
    }
  }
  const memory::PrefillPeak peak = memory::prefill_peak(
      spec, windows, memory, selecting_layers(rules), snap, bound.prompt_tokens);
  return bound.schedule == PrefillSchedule::kWholePrompt ? peak.whole_prompt_peak_bytes
                                                         : peak.layer_by_layer_peak_bytes;
}

PeakBound peak_bound(const arch::ModelSpec& spec, const memory::HeadWindows& walk,
                     const KeepRuleOptions& o) {
  const PeakBound bound{o.prefill_peak, o.prefill_schedule, o.memory.context};
  const int64_t steady = memory::estimate(spec, walk, o.memory).total_bytes;
  if (bound.active() && bound.bytes < steady) {
    throw_field_error("prefill_peak",
                      " {} is below the {} bytes the walk's windows hold in decode (no head "
                      "stages); give at least {}",
                      bound.bytes, steady, field_ref("budget"));
  }
  return bound;
}

PrefillPeakBound checked_peak(const arch::ModelSpec& spec, const memory::HeadWindows& windows,
                              const std::map<int64_t, std::vector<policy::KeepRule>>& rules,
                              const memory::MemoryOptions& memory, const PeakBound& bound) {
  const int64_t bytes = policy_peak(spec, windows, rules, memory, bound);
  HEADWISE_CHECK(bytes <= bound.bytes, "keep rules: the joint choice is over --prefill-peak");
  const bool whole = bound.schedule == PrefillSchedule::kWholePrompt;
  spdlog::info("keep rules: prefill peak {} bytes ({} of a {}-token prompt), bound {}", bytes,
               whole ? "whole-prompt staging" : "layer by layer", bound.prompt_tokens, bound.bytes);
  return {bound.bytes, whole ? "whole" : "layer", bound.prompt_tokens, bytes};
}

}  // namespace headwise::calib::joint

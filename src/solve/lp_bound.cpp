// LP relaxation of the MCKP and the feasible solutions read off it. The LP optimum walks all
// hull steps in order of efficiency (distortion saved per byte) until one no longer fits: that
// split step's efficiency is the optimal Lagrange multiplier, and the integer solutions next to
// the LP point are the incumbents the exact search has to beat.
#include <algorithm>
#include <tuple>

#include "frontier.hpp"

namespace headwise::solve::detail {
namespace {

struct Step {
  double efficiency;
  uint32_t group;
  uint32_t index;  // hull[index] -> hull[index + 1]
};

const Option& hull_option(const Group& group, const GroupFrontier& frontier, size_t position) {
  return group.options[frontier.pareto[frontier.hull[position]]];
}

// Moves every group, in input order, to its least-distortion option that still fits the
// slack. After one pass no single-group change helps: the slack only shrinks.
void improve_by_single_moves(const std::vector<Group>& groups,
                             const std::vector<GroupFrontier>& frontiers, int64_t budget,
                             SolveResult& solution) {
  finish_totals(groups, solution);
  int64_t slack = budget - solution.total_bytes;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Option& current = groups[g].options[solution.choice[g]];
    size_t best = solution.choice[g];
    for (size_t index : frontiers[g].pareto) {
      const Option& option = groups[g].options[index];
      if (option.bytes - current.bytes <= slack &&
          option.distortion < groups[g].options[best].distortion) {
        best = index;
      }
    }
    slack -= groups[g].options[best].bytes - current.bytes;
    solution.choice[g] = best;
  }
  finish_totals(groups, solution);
}

// Takes the LP's split step in full (over budget), then undoes the cheapest single downgrade
// that brings the total back under the budget. Empty when no single downgrade suffices.
std::optional<SolveResult> round_up_and_repair(const std::vector<Group>& groups,
                                               const std::vector<GroupFrontier>& frontiers,
                                               std::vector<size_t> positions, const Step& split,
                                               int64_t budget) {
  positions[split.group] = split.index + 1;
  SolveResult solution;
  for (size_t g = 0; g < groups.size(); ++g)
    solution.choice.push_back(frontiers[g].pareto[frontiers[g].hull[positions[g]]]);
  finish_totals(groups, solution);
  const int64_t excess = solution.total_bytes - budget;
  std::optional<std::tuple<double, size_t, size_t>> best;  // (added distortion, group, option)
  for (size_t g = 0; g < groups.size(); ++g) {
    const Option& current = groups[g].options[solution.choice[g]];
    for (size_t index : frontiers[g].pareto) {
      const Option& option = groups[g].options[index];
      if (current.bytes - option.bytes < excess) continue;
      const double added = option.distortion - current.distortion;
      if (!best || added < std::get<0>(*best)) best = std::make_tuple(added, g, index);
    }
  }
  if (!best) return std::nullopt;
  solution.choice[std::get<1>(*best)] = std::get<2>(*best);
  improve_by_single_moves(groups, frontiers, budget, solution);
  return solution;
}

}  // namespace

LpBound lp_bound(const std::vector<Group>& groups, const std::vector<GroupFrontier>& frontiers,
                 int64_t budget) {
  std::vector<Step> steps;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < frontiers[g].efficiency.size(); ++i) {
      steps.push_back(
          {frontiers[g].efficiency[i], static_cast<uint32_t>(g), static_cast<uint32_t>(i)});
    }
  }
  // Most efficient first; the fixed tie order keeps each group's own steps in hull order
  // (their efficiencies never increase) and makes the walk deterministic.
  std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) {
    if (a.efficiency != b.efficiency) return a.efficiency > b.efficiency;
    return std::tie(a.group, a.index) < std::tie(b.group, b.index);
  });

  std::vector<size_t> positions(groups.size(), 0);
  int64_t bytes = 0;
  for (size_t g = 0; g < groups.size(); ++g) bytes += hull_option(groups[g], frontiers[g], 0).bytes;
  std::vector<bool> blocked(groups.size(), false);
  std::optional<Step> split;
  std::vector<size_t> split_positions;
  for (const Step& step : steps) {
    if (blocked[step.group]) continue;
    const int64_t cost =
        hull_option(groups[step.group], frontiers[step.group], step.index + 1).bytes -
        hull_option(groups[step.group], frontiers[step.group], step.index).bytes;
    if (bytes + cost <= budget) {
      bytes += cost;
      positions[step.group] = step.index + 1;
      continue;
    }
    // A group's later steps depend on this one, so the greedy fill skips the whole group.
    blocked[step.group] = true;
    if (!split) {
      split = step;
      split_positions = positions;
    }
  }

  LpBound bound;
  bound.lambda = split ? split->efficiency : 0.0;
  long double dual = -static_cast<long double>(bound.lambda) * budget;
  for (size_t g = 0; g < groups.size(); ++g) {
    long double least = 0.0;
    bool first = true;
    for (size_t index : frontiers[g].pareto) {
      const Option& option = groups[g].options[index];
      const long double value =
          option.distortion + static_cast<long double>(bound.lambda) * option.bytes;
      if (first || value < least) least = value;
      first = false;
    }
    dual += least;
  }
  bound.lower_bound = dual;

  // Greedy fill: the LP point rounded down plus every later step that still fit.
  bound.incumbent.choice.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g)
    bound.incumbent.choice[g] = frontiers[g].pareto[frontiers[g].hull[positions[g]]];
  improve_by_single_moves(groups, frontiers, budget, bound.incumbent);
  if (split) {
    if (auto repaired = round_up_and_repair(groups, frontiers, split_positions, *split, budget)) {
      if (better_solution(*repaired, bound.incumbent)) bound.incumbent = std::move(*repaired);
    }
  }
  return bound;
}

}  // namespace headwise::solve::detail

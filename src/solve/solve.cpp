// Public entry points: the exact solver with its documented special cases, and the completion
// and upgrade sub-problems the calibration controller uses.
#include <optional>
#include <tuple>

#include "frontier.hpp"
#include "headwise/core/error.hpp"

namespace headwise::solve {
namespace {

size_t largest_window(const Group& group) {
  size_t best = 0;
  for (size_t i = 1; i < group.options.size(); ++i) {
    if (group.options[i].window > group.options[best].window) best = i;
  }
  return best;
}

// Free upgrades: options with more bytes and no more distortion, one step (the next larger
// such option) per group per pass, groups in input order, until a pass changes nothing.
void spend_leftover(const std::vector<Group>& groups, int64_t budget, SolveResult& result) {
  int64_t slack = budget - result.total_bytes;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t g = 0; g < groups.size(); ++g) {
      const Option& current = groups[g].options[result.choice[g]];
      std::optional<size_t> step;
      for (size_t i = 0; i < groups[g].options.size(); ++i) {
        const Option& option = groups[g].options[i];
        if (option.bytes <= current.bytes || option.bytes - current.bytes > slack) continue;
        if (option.distortion > current.distortion) continue;
        if (!step) {
          step = i;
          continue;
        }
        const Option& chosen = groups[g].options[*step];
        if (std::tie(option.bytes, option.distortion) < std::tie(chosen.bytes, chosen.distortion) ||
            (option.bytes == chosen.bytes && option.distortion == chosen.distortion &&
             option.window > chosen.window)) {
          step = i;
        }
      }
      if (!step) continue;
      slack -= groups[g].options[*step].bytes - current.bytes;
      result.choice[g] = *step;
      changed = true;
    }
  }
  detail::finish_totals(groups, result);
}

// The exact path: hulls, LP bound and incumbent, exact search, then free upgrades.
SolveResult solve_core(const std::vector<Group>& groups, int64_t budget,
                       const SolveOptions& options) {
  const auto frontiers = detail::build_frontiers(groups);
  const auto bound = detail::lp_bound(groups, frontiers, budget);
  SolveResult result = detail::exact_search(groups, frontiers, budget, bound, options.max_states);
  if (options.spend_leftover) spend_leftover(groups, budget, result);
  return result;
}

// "Full KV fits": every group at its largest window. It is also optimal when each group's
// largest window has its least distortion; otherwise the exact optimum is computed to say so.
SolveResult largest_everywhere(const std::vector<Group>& groups, int64_t budget,
                               const SolveOptions& options) {
  SolveResult result;
  bool each_least = true;
  for (const auto& group : groups) {
    const size_t pick = largest_window(group);
    result.choice.push_back(pick);
    for (const auto& option : group.options) {
      if (option.distortion < group.options[pick].distortion) each_least = false;
    }
  }
  detail::finish_totals(groups, result);
  result.proven_optimal = each_least;
  if (!each_least) {
    SolveOptions exact = options;
    exact.spend_leftover = false;
    const SolveResult best = solve_core(groups, budget, exact);
    result.proven_optimal = best.proven_optimal && result.total_distortion <= best.total_distortion;
  }
  return result;
}

// Solves the groups listed in `members` (with their allowed option indices) and writes the
// choices into `result.choice` at the members' positions.
SolveResult solve_subproblem(const std::vector<Group>& groups, const std::vector<size_t>& members,
                             const std::vector<std::vector<size_t>>& allowed, int64_t budget,
                             const SolveOptions& options, std::vector<size_t> choice) {
  std::vector<Group> sub;
  sub.reserve(members.size());
  for (size_t k = 0; k < members.size(); ++k) {
    const Group& group = groups[members[k]];
    Group restricted{group.layer_id, group.kv_head, {}};
    for (size_t index : allowed[k]) restricted.options.push_back(group.options[index]);
    sub.push_back(std::move(restricted));
  }
  SolveResult partial = solve_exact(sub, budget, options);
  for (size_t k = 0; k < members.size(); ++k) choice[members[k]] = allowed[k][partial.choice[k]];
  SolveResult result;
  result.choice = std::move(choice);
  result.proven_optimal = partial.proven_optimal;
  detail::finish_totals(groups, result);
  return result;
}

}  // namespace

SolveResult solve_exact(const std::vector<Group>& groups, int64_t budget,
                        const SolveOptions& options) {
  validate_groups(groups);
  const int64_t minimum = min_total_bytes(groups);
  if (minimum > budget) detail::throw_infeasible(budget, minimum);
  if (budget >= max_window_total_bytes(groups)) return largest_everywhere(groups, budget, options);
  SolveResult result = solve_core(groups, budget, options);
  HEADWISE_CHECK(result.total_bytes <= budget, "solver exceeded the budget: {} > {}",
                 result.total_bytes, budget);
  return result;
}

SolveResult solve_completion(const std::vector<Group>& groups,
                             const std::vector<std::optional<size_t>>& fixed, int64_t budget,
                             const SolveOptions& options) {
  validate_groups(groups);
  if (fixed.size() != groups.size()) {
    throw_input_error("completion: {} fixed entries for {} heads", fixed.size(), groups.size());
  }
  std::vector<size_t> choice(groups.size(), 0);
  std::vector<size_t> members;
  std::vector<std::vector<size_t>> allowed;
  int64_t fixed_bytes = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!fixed[g]) {
      members.push_back(g);
      allowed.emplace_back(groups[g].options.size());
      for (size_t i = 0; i < groups[g].options.size(); ++i) allowed.back()[i] = i;
      continue;
    }
    if (*fixed[g] >= groups[g].options.size()) {
      throw_input_error("layer {} KV head {}: fixed option {} out of range ({} options)",
                        groups[g].layer_id, groups[g].kv_head, *fixed[g], groups[g].options.size());
    }
    choice[g] = *fixed[g];
    fixed_bytes += groups[g].options[*fixed[g]].bytes;
  }
  std::vector<Group> free_groups;
  for (size_t g : members) free_groups.push_back(groups[g]);
  const int64_t minimum = fixed_bytes + min_total_bytes(free_groups);
  if (minimum > budget) detail::throw_infeasible(budget, minimum);
  return solve_subproblem(groups, members, allowed, budget - fixed_bytes, options,
                          std::move(choice));
}

SolveResult solve_upgrade(const std::vector<Group>& groups, const std::vector<size_t>& current,
                          int64_t budget, const SolveOptions& options) {
  validate_groups(groups);
  if (current.size() != groups.size()) {
    throw_input_error("upgrade: {} current choices for {} heads", current.size(), groups.size());
  }
  std::vector<size_t> members(groups.size());
  std::vector<std::vector<size_t>> allowed(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (current[g] >= groups[g].options.size()) {
      throw_input_error("layer {} KV head {}: current option {} out of range ({} options)",
                        groups[g].layer_id, groups[g].kv_head, current[g],
                        groups[g].options.size());
    }
    members[g] = g;
    for (size_t i = 0; i < groups[g].options.size(); ++i) {
      if (groups[g].options[i].bytes >= groups[g].options[current[g]].bytes)
        allowed[g].push_back(i);
    }
  }
  return solve_subproblem(groups, members, allowed, budget, options,
                          std::vector<size_t>(groups.size(), 0));
}

}  // namespace headwise::solve

// Lagrangian relaxation helpers for the calibration controller: each head independently
// minimises d + lambda * bytes. Both functions read the convex hulls, so relax_at and
// min_fitting_lambda agree exactly at breakpoints (no re-derived floating comparisons).
#include <algorithm>
#include <cmath>

#include "frontier.hpp"
#include "headwise/core/error.hpp"

namespace headwise::solve {
namespace {

SolveResult relax_with(const std::vector<Group>& groups,
                       const std::vector<detail::GroupFrontier>& frontiers, double lambda) {
  SolveResult result;
  result.choice.reserve(groups.size());
  for (const auto& frontier : frontiers) {
    result.choice.push_back(
        frontier.pareto[frontier.hull[detail::hull_position_at(frontier, lambda)]]);
  }
  detail::finish_totals(groups, result);
  // The relaxed solution is optimal for the budget it happens to use.
  result.proven_optimal = true;
  return result;
}

int64_t relaxed_bytes(const std::vector<Group>& groups,
                      const std::vector<detail::GroupFrontier>& frontiers, double lambda) {
  int64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& frontier = frontiers[g];
    total +=
        groups[g]
            .options[frontier.pareto[frontier.hull[detail::hull_position_at(frontier, lambda)]]]
            .bytes;
  }
  return total;
}

void check_lambda(double lambda) {
  if (!(lambda >= 0.0) || std::isinf(lambda)) {
    throw_input_error("Lagrange multiplier must be finite and >= 0, got {}", lambda);
  }
}

}  // namespace

SolveResult relax_at(const std::vector<Group>& groups, double lambda) {
  validate_groups(groups);
  check_lambda(lambda);
  return relax_with(groups, detail::build_frontiers(groups), lambda);
}

double min_fitting_lambda(const std::vector<Group>& groups, int64_t budget) {
  validate_groups(groups);
  const int64_t minimum = min_total_bytes(groups);
  if (minimum > budget) {
    detail::throw_infeasible(budget, minimum);
  }
  const auto frontiers = detail::build_frontiers(groups);
  if (relaxed_bytes(groups, frontiers, 0.0) <= budget) return 0.0;
  // Relaxed bytes only change at hull efficiencies and never grow with lambda; above the
  // largest efficiency every head sits at its fewest bytes, which fits (checked above).
  std::vector<double> breakpoints;
  for (const auto& frontier : frontiers) {
    breakpoints.insert(breakpoints.end(), frontier.efficiency.begin(), frontier.efficiency.end());
  }
  std::sort(breakpoints.begin(), breakpoints.end());
  breakpoints.erase(std::unique(breakpoints.begin(), breakpoints.end()), breakpoints.end());
  size_t lo = 0, hi = breakpoints.size() - 1;  // breakpoints[hi] fits
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (relaxed_bytes(groups, frontiers, breakpoints[mid]) <= budget) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return breakpoints[lo];
}

}  // namespace headwise::solve

#pragma once
// Internal to src/solve: per-group Pareto lists and convex hulls, the pieces every solver
// path (Lagrangian, LP bound, exact search) is built on.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "headwise/solve/mckp.hpp"

namespace headwise::solve::detail {

// Options of one group that are not dominated: bytes strictly increasing, distortion strictly
// decreasing. An option with more bytes and no less distortion can never be needed for the
// minimum (free upgrades re-add such options afterwards). Indices into Group::options.
struct GroupFrontier {
  std::vector<size_t> pareto;
  // Positions in `pareto` of the lower convex hull (LP-dominance): the options a Lagrangian
  // solution can take. Starts at pareto[0], the fewest bytes.
  std::vector<size_t> hull;
  // efficiency[i] = distortion saved per byte going from hull[i] to hull[i+1]; strictly
  // decreasing in exact arithmetic, non-increasing after rounding.
  std::vector<double> efficiency;
};

GroupFrontier build_frontier(const Group& group);
std::vector<GroupFrontier> build_frontiers(const std::vector<Group>& groups);

// Position in `hull` the Lagrangian solution takes at lambda: hull steps are taken while their
// efficiency is strictly above lambda, so ties go to fewer bytes.
size_t hull_position_at(const GroupFrontier& frontier, double lambda);

// Fills bytes and distortion (summed in group order) from the choice.
void finish_totals(const std::vector<Group>& groups, SolveResult& result);

// Lexicographic "better": less distortion, then fewer bytes.
bool better_solution(const SolveResult& a, const SolveResult& b);

// InfeasibleError that states the minimum feasible budget.
[[noreturn]] void throw_infeasible(int64_t budget, int64_t minimum);

// LP relaxation (greedy on hull efficiencies) and the integer solutions read off it.
struct LpBound {
  double lambda = 0.0;            // LP-optimal multiplier: efficiency of the split step
  long double lower_bound = 0.0;  // Lagrangian dual value at lambda, <= the optimum
  SolveResult incumbent;          // best feasible solution of the heuristics
};
LpBound lp_bound(const std::vector<Group>& groups, const std::vector<GroupFrontier>& frontiers,
                 int64_t budget);

// Exact search given the bound (reduced-cost fixing, then a Pareto DP over the free groups).
SolveResult exact_search(const std::vector<Group>& groups,
                         const std::vector<GroupFrontier>& frontiers, int64_t budget,
                         const LpBound& bound, size_t max_states);

}  // namespace headwise::solve::detail

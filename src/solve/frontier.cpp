#include "frontier.hpp"

#include <algorithm>
#include <numeric>

#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"

namespace headwise::solve::detail {

GroupFrontier build_frontier(const Group& group) {
  const auto& options = group.options;
  std::vector<size_t> order(options.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Fewest bytes first; on equal bytes the least distortion, then the larger window, so the
  // first survivor of a tie is the one the documented rule prefers.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Option& x = options[a];
    const Option& y = options[b];
    if (x.bytes != y.bytes) return x.bytes < y.bytes;
    if (x.distortion != y.distortion) return x.distortion < y.distortion;
    return x.window > y.window;
  });
  GroupFrontier frontier;
  for (size_t index : order) {
    if (frontier.pareto.empty() ||
        options[index].distortion < options[frontier.pareto.back()].distortion) {
      frontier.pareto.push_back(index);
    }
  }
  // Lower convex hull over (bytes, distortion) of the Pareto points. Cross products in long
  // double: bytes reach 1e10 and distortions differ in late digits.
  auto point = [&](size_t position) { return options[frontier.pareto[position]]; };
  for (size_t position = 0; position < frontier.pareto.size(); ++position) {
    while (frontier.hull.size() >= 2) {
      const Option a = point(frontier.hull[frontier.hull.size() - 2]);
      const Option b = point(frontier.hull.back());
      const Option c = point(position);
      const long double saved_ab = static_cast<long double>(a.distortion) - b.distortion;
      const long double saved_bc = static_cast<long double>(b.distortion) - c.distortion;
      const long double bytes_ab = static_cast<long double>(b.bytes - a.bytes);
      const long double bytes_bc = static_cast<long double>(c.bytes - b.bytes);
      // b stays only if a->b saves strictly more per byte than b->c (collinear b goes too).
      if (saved_ab * bytes_bc > saved_bc * bytes_ab) break;
      frontier.hull.pop_back();
    }
    frontier.hull.push_back(position);
  }
  for (size_t i = 0; i + 1 < frontier.hull.size(); ++i) {
    const Option a = point(frontier.hull[i]);
    const Option b = point(frontier.hull[i + 1]);
    frontier.efficiency.push_back((a.distortion - b.distortion) /
                                  static_cast<double>(b.bytes - a.bytes));
  }
  return frontier;
}

std::vector<GroupFrontier> build_frontiers(const std::vector<Group>& groups) {
  std::vector<GroupFrontier> frontiers;
  frontiers.reserve(groups.size());
  for (const auto& group : groups) frontiers.push_back(build_frontier(group));
  return frontiers;
}

size_t hull_position_at(const GroupFrontier& frontier, double lambda) {
  size_t position = 0;
  while (position < frontier.efficiency.size() && frontier.efficiency[position] > lambda)
    ++position;
  return position;
}

void finish_totals(const std::vector<Group>& groups, SolveResult& result) {
  result.total_bytes = 0;
  result.total_distortion = 0.0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Option& option = groups[g].options[result.choice[g]];
    result.total_bytes += option.bytes;
    result.total_distortion += option.distortion;
  }
}

bool better_solution(const SolveResult& a, const SolveResult& b) {
  if (a.total_distortion != b.total_distortion) return a.total_distortion < b.total_distortion;
  return a.total_bytes < b.total_bytes;
}

void throw_infeasible(int64_t budget, int64_t minimum) {
  throw InfeasibleError(
      fmt::format("budget {} B ({}) is below the minimum feasible budget {} B ({}): the smallest "
                  "window for every head",
                  budget, format_bytes(budget), minimum, format_bytes(minimum)));
}

}  // namespace headwise::solve::detail

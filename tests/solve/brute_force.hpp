#pragma once
// Test helpers: seeded random MCKP instances and an exhaustive reference solver.
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "headwise/solve/mckp.hpp"

namespace headwise::solve::testing {

struct Reference {
  double distortion = 0.0;  // least total distortion (summed in group order)
  int64_t bytes = 0;        // fewest bytes among the minimisers
};

// Enumerates every choice with allowed[g] (all options when empty) that fits the budget.
inline std::optional<Reference> brute_force(const std::vector<Group>& groups, int64_t budget,
                                            const std::vector<std::vector<size_t>>& allowed = {}) {
  std::vector<std::vector<size_t>> options(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!allowed.empty()) {
      options[g] = allowed[g];
    } else {
      for (size_t i = 0; i < groups[g].options.size(); ++i) options[g].push_back(i);
    }
  }
  std::optional<Reference> best;
  std::vector<size_t> at(groups.size(), 0);
  while (true) {
    int64_t bytes = 0;
    double distortion = 0.0;
    for (size_t g = 0; g < groups.size(); ++g) {
      bytes += groups[g].options[options[g][at[g]]].bytes;
      distortion += groups[g].options[options[g][at[g]]].distortion;
    }
    if (bytes <= budget && (!best || distortion < best->distortion ||
                            (distortion == best->distortion && bytes < best->bytes))) {
      best = Reference{distortion, bytes};
    }
    size_t g = 0;
    while (g < groups.size() && ++at[g] == options[g].size()) at[g++] = 0;
    if (g == groups.size()) break;
  }
  return best;
}

// Small instances built to hit the awkward cases: equal bytes, equal distortions, zeros,
// dominated options, a single option. Distortions are multiples of 1/8 so every sum is exact
// and ties are real ties whatever the summation order.
inline std::vector<Group> random_small_instance(std::mt19937_64& rng, size_t max_groups = 6,
                                                size_t max_options = 5) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t groups_count = pick(1, static_cast<int64_t>(max_groups));
  const bool sinks = pick(0, 1) == 1;
  const int64_t unit = pick(0, 2) == 0 ? 1 : 16 * pick(1, 4);
  std::vector<Group> groups;
  for (int64_t g = 0; g < groups_count; ++g) {
    Group group{g / 2, g % 2, {}};
    const int64_t count = pick(1, static_cast<int64_t>(max_options));
    std::vector<int64_t> windows = {1, 2, 4, 8, 16, 32, 64, kFullWindow};
    std::shuffle(windows.begin(), windows.end(), rng);
    for (int64_t k = 0; k < count; ++k) {
      Option option;
      option.window = windows[static_cast<size_t>(k)];
      option.bytes = pick(0, 6) * unit + (sinks ? pick(0, 3) : 0);
      option.distortion = pick(0, 3) == 0 ? 0.0 : static_cast<double>(pick(0, 24)) / 8.0;
      group.options.push_back(option);
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

inline int64_t max_total_bytes(const std::vector<Group>& groups) {
  int64_t total = 0;
  for (const auto& group : groups) {
    int64_t most = 0;
    for (const auto& option : group.options) most = std::max(most, option.bytes);
    total += most;
  }
  return total;
}

// Budgets around the interesting points: infeasible, exactly minimal, between, tight, loose.
inline std::vector<int64_t> interesting_budgets(const std::vector<Group>& groups,
                                                std::mt19937_64& rng) {
  const int64_t low = min_total_bytes(groups);
  const int64_t high = max_total_bytes(groups);
  std::vector<int64_t> budgets = {low - 1, low, high, high + 7, max_window_total_bytes(groups) - 1};
  for (int i = 0; i < 3; ++i)
    budgets.push_back(std::uniform_int_distribution<int64_t>(low, std::max(low, high))(rng));
  return budgets;
}

}  // namespace headwise::solve::testing

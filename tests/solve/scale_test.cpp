#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <random>

#include "brute_force.hpp"
#include "headwise/core/error.hpp"
#include "headwise/solve/mckp.hpp"

using namespace headwise;
using namespace headwise::solve;
using namespace headwise::solve::testing;

namespace {

// Classic DP over every capacity 0..budget: exact, independent of the solver's bounds, and
// affordable when bytes are small. Returns the least distortion (+inf when infeasible).
double capacity_dp(const std::vector<Group>& groups, int64_t budget) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> best(static_cast<size_t>(budget) + 1, 0.0), next;
  for (const auto& group : groups) {
    next.assign(best.size(), inf);
    for (int64_t c = 0; c <= budget; ++c) {
      for (const auto& option : group.options) {
        if (option.bytes <= c)
          next[c] = std::min(next[c], best[c - option.bytes] + option.distortion);
      }
    }
    best.swap(next);
  }
  return best[static_cast<size_t>(budget)];
}

// Not proven optimal only under the full-everywhere rule: every head at its largest allowed window.
bool at_largest_windows(const std::vector<Group>& groups, const SolveResult& result,
                        const std::vector<std::vector<size_t>>& allowed) {
  for (size_t g = 0; g < groups.size(); ++g) {
    size_t largest = allowed[g][0];
    for (size_t i : allowed[g]) {
      if (groups[g].options[i].window > groups[g].options[largest].window) largest = i;
    }
    if (result.choice[g] != largest) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("exact solver equals a capacity DP on medium instances", "[solve]") {
  // 40-120 groups: far beyond brute force, small bytes so the reference DP is cheap. Quarter
  // distortions keep every sum exact.
  std::mt19937_64 rng(77);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int compared = 0;
  for (int instance = 0; instance < 60; ++instance) {
    std::vector<Group> groups;
    const int64_t count = pick(40, 120);
    for (int64_t g = 0; g < count; ++g) {
      Group group{g / 8, g % 8, {}};
      const int64_t levels = pick(2, 6);
      for (int64_t k = 0; k < levels; ++k) {
        group.options.push_back({k == levels - 1 ? kFullWindow : (int64_t{1024} << (2 * k)),
                                 pick(0, 40), static_cast<double>(pick(0, 64)) / 4.0});
      }
      groups.push_back(std::move(group));
    }
    const int64_t low = min_total_bytes(groups), high = max_total_bytes(groups);
    for (int b = 0; b < 3; ++b) {
      const int64_t budget =
          pick(low, std::max(low, std::min(high, max_window_total_bytes(groups) - 1)));
      if (budget >= max_window_total_bytes(groups)) continue;
      const auto result = solve_exact(groups, budget);
      INFO("instance " << instance << " budget " << budget);
      CHECK(result.proven_optimal);
      CHECK(result.total_bytes <= budget);
      CHECK(result.total_distortion == capacity_dp(groups, budget));
      ++compared;
    }
  }
  CHECK(compared > 150);
}

TEST_CASE("large instances never exceed the budget and are deterministic", "[solve]") {
  // Random bytes with gcd 1 and values up to ~1e8, distortions spanning 8 decades.
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int instance = 0; instance < 12; ++instance) {
    std::vector<Group> groups;
    for (int g = 0; g < 512; ++g) {
      Group group{g / 8, g % 8, {}};
      for (int k = 0; k < 6; ++k) {
        const auto bytes = static_cast<int64_t>(1e8 * unit(rng)) + 1;
        group.options.push_back({int64_t{1} << (10 + k), bytes, std::pow(10.0, -8.0 * unit(rng))});
      }
      groups.push_back(std::move(group));
    }
    const int64_t low = min_total_bytes(groups), high = max_window_total_bytes(groups);
    for (double fraction : {0.0, 0.01, 0.2, 0.5, 0.9, 0.999}) {
      const int64_t budget = low + static_cast<int64_t>(fraction * static_cast<double>(high - low));
      const auto first = solve_exact(groups, budget);
      const auto second = solve_exact(groups, budget);
      CHECK(first.total_bytes <= budget);
      CHECK(first.proven_optimal);
      CHECK(first.choice == second.choice);
      CHECK(first.total_distortion == second.total_distortion);
      // Never worse than the Lagrangian solution that fits.
      CHECK(first.total_distortion <=
            relax_at(groups, min_fitting_lambda(groups, budget)).total_distortion);
    }
  }
}

TEST_CASE("realistic 64x8x6 instances solve fast and within budget", "[solve]") {
  for (int64_t sinks : {0, 4}) {
    const auto groups = make_benchmark_groups(64, 8, 6, 11, sinks);
    REQUIRE(groups.size() == 512);
    const int64_t full = max_window_total_bytes(groups);
    for (int tenth = 1; tenth <= 9; ++tenth) {
      const int64_t budget = full / 10 * tenth;
      const auto result = solve_exact(groups, budget);
      CHECK(result.total_bytes <= budget);
      CHECK(result.proven_optimal);
    }
    const double ms = benchmark_solver_ms(64, 8, 6, 11, sinks);
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__)
    CHECK(ms < 100.0);
#else
    CHECK(ms < 2000.0);  // unoptimised or sanitised builds: only a gross regression fails
#endif
  }
  CHECK_THROWS_AS(make_benchmark_groups(0, 8, 6, 1, 0), InputError);
}

TEST_CASE("exact completion and upgrade equal brute force", "[solve]") {
  std::mt19937_64 rng(99);
  int compared = 0;
  for (int instance = 0; instance < 1500; ++instance) {
    const auto groups = random_small_instance(rng);
    std::vector<std::optional<size_t>> fixed(groups.size());
    std::vector<size_t> current(groups.size());
    std::vector<std::vector<size_t>> fixed_allowed(groups.size()), upgrade_allowed(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      const size_t n = groups[g].options.size();
      current[g] = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
      if (rng() % 2) fixed[g] = current[g];
      for (size_t i = 0; i < n; ++i) {
        if (!fixed[g] || *fixed[g] == i) fixed_allowed[g].push_back(i);
        if (groups[g].options[i].bytes >= groups[g].options[current[g]].bytes)
          upgrade_allowed[g].push_back(i);
      }
    }
    for (int64_t budget : interesting_budgets(groups, rng)) {
      const SolveOptions lean{.spend_leftover = false};
      if (const auto reference = brute_force(groups, budget, fixed_allowed)) {
        const auto result = solve_completion(groups, fixed, budget, lean);
        for (size_t g = 0; g < groups.size(); ++g) {
          if (fixed[g]) CHECK(result.choice[g] == *fixed[g]);
        }
        CHECK(result.total_bytes <= budget);
        // The full-everywhere rule applies to the free heads; elsewhere it is the optimum.
        if (result.proven_optimal) CHECK(result.total_distortion <= reference->distortion);
        CHECK(result.total_distortion >= reference->distortion);
        if (!result.proven_optimal) CHECK(at_largest_windows(groups, result, fixed_allowed));
        ++compared;
      } else {
        CHECK_THROWS_AS(solve_completion(groups, fixed, budget, lean), InfeasibleError);
      }
      if (const auto reference = brute_force(groups, budget, upgrade_allowed)) {
        const auto result = solve_upgrade(groups, current, budget, lean);
        for (size_t g = 0; g < groups.size(); ++g) {
          CHECK(groups[g].options[result.choice[g]].bytes >= groups[g].options[current[g]].bytes);
        }
        CHECK(result.total_bytes <= budget);
        if (result.proven_optimal) CHECK(result.total_distortion <= reference->distortion);
        CHECK(result.total_distortion >= reference->distortion);
        if (!result.proven_optimal) CHECK(at_largest_windows(groups, result, upgrade_allowed));
        ++compared;
      } else {
        CHECK_THROWS_AS(solve_upgrade(groups, current, budget, lean), InfeasibleError);
      }
    }
  }
  CHECK(compared > 5000);
  const std::vector<Group> one = {{0, 0, {{1024, 1, 1.0}}}};
  CHECK_THROWS_AS(solve_completion(one, {}, 10), InputError);
  CHECK_THROWS_AS(solve_completion(one, {size_t{3}}, 10), InputError);
  CHECK_THROWS_AS(solve_upgrade(one, {size_t{1}}, 10), InputError);
}

// solve::fit_coupled: fitting a choice to a budget whose total is not a sum over groups (vLLM's
// reservation). Checked on additive totals against the exhaustive optimum and on a coupled total
// (a layer's mixed windows pay a padding surcharge, as vLLM's padded pages do).
#include <catch2/catch.hpp>

#include <random>

#include "brute_force.hpp"
#include "headwise/core/error.hpp"
#include "headwise/solve/mckp.hpp"

using namespace headwise;
using namespace headwise::solve;

namespace {

int64_t additive(const std::vector<Group>& groups, const std::vector<size_t>& choice) {
  int64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) total += groups[g].options[choice[g]].bytes;
  return total;
}

// Two layers of three heads, levels 64 < 256 < full with 1, 4 and 16 units; a layer whose heads
// do not all share one window pays 3 units more (a padded page).
std::vector<Group> layered() {
  std::vector<Group> groups;
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t h = 0; h < 3; ++h) {
      const double weight = 1.0 + static_cast<double>(h + 3 * layer);
      groups.push_back(
          {layer, h, {{64, 1, 4.0 * weight}, {256, 4, 1.0 * weight}, {kFullWindow, 16, 0.0}}});
    }
  }
  return groups;
}

int64_t coupled(const std::vector<Group>& groups, const std::vector<size_t>& choice) {
  int64_t total = additive(groups, choice);
  for (size_t first = 0; first < groups.size(); first += 3) {
    if (choice[first] != choice[first + 1] || choice[first] != choice[first + 2]) total += 3;
  }
  return total;
}

}  // namespace

TEST_CASE("fit_coupled fits additive totals, never above the budget", "[solve]") {
  std::mt19937_64 rng(54);
  for (int trial = 0; trial < 300; ++trial) {
    const auto groups = testing::random_small_instance(rng);
    const int64_t lo = min_total_bytes(groups), hi = testing::max_total_bytes(groups);
    const int64_t budget = lo + std::uniform_int_distribution<int64_t>(0, hi - lo)(rng);
    std::vector<size_t> start(groups.size());
    for (size_t g = 0; g < groups.size(); ++g)
      start[g] = std::uniform_int_distribution<size_t>(0, groups[g].options.size() - 1)(rng);
    const auto total = [&](const std::vector<size_t>& c) { return additive(groups, c); };
    const SolveResult fit = fit_coupled(groups, start, total, budget);
    CAPTURE(trial, budget);
    REQUIRE(fit.total_bytes == additive(groups, fit.choice));
    REQUIRE(fit.total_bytes <= budget);
    const auto best = testing::brute_force(groups, budget);
    REQUIRE(best.has_value());
    REQUIRE(fit.total_distortion >= best->distortion - 1e-12);
    // Deterministic.
    REQUIRE(fit_coupled(groups, start, total, budget).choice == fit.choice);
  }
}

TEST_CASE("fit_coupled: a coupled total, promotions and the infeasible case", "[solve]") {
  const auto groups = layered();
  const auto total = [&](const std::vector<size_t>& c) { return coupled(groups, c); };
  const std::vector<size_t> all_full(6, 2), all_64(6, 0);
  REQUIRE(total(all_full) == 96);
  REQUIRE(total(all_64) == 6);

  SECTION("from full KV down to the budget, in the coupled bytes") {
    for (int64_t budget : {6, 7, 12, 24, 30, 40, 60, 95}) {
      const SolveResult fit = fit_coupled(groups, all_full, total, budget);
      CAPTURE(budget);
      REQUIRE(fit.total_bytes == total(fit.choice));
      REQUIRE(fit.total_bytes <= budget);
    }
  }
  SECTION("a budget the cheapest choice misses is infeasible") {
    REQUIRE_THROWS_AS(fit_coupled(groups, all_full, total, 5), InfeasibleError);
  }
  SECTION("a window that costs what full costs becomes full") {
    auto g = groups;
    g[0].options[1].bytes = 16;  // head 0 of layer 0: 256 costs as much as full
    const auto flat = [&](const std::vector<size_t>& c) { return additive(g, c); };
    std::vector<size_t> start(6, 1);
    const SolveResult fit = fit_coupled(g, start, flat, flat(start));
    REQUIRE(fit.choice[0] == 2);
    REQUIRE(fit.total_bytes == flat(start));
  }
  SECTION("bytes left over buy the best distortion per byte") {
    const SolveResult fit = fit_coupled(groups, all_64, total, 6 + 3 + 3);
    REQUIRE(fit.total_bytes <= 12);
    REQUIRE(fit.total_distortion < 4.0 * 21.0);
  }
}

#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "brute_force.hpp"
#include "headwise/core/error.hpp"
#include "headwise/solve/mckp.hpp"

using namespace headwise;
using namespace headwise::solve;
using namespace headwise::solve::testing;

namespace {

// Direct argmin of d + lambda * bytes; ties: fewer bytes, then the larger window.
size_t direct_argmin(const Group& group, double lambda) {
  size_t best = 0;
  for (size_t i = 1; i < group.options.size(); ++i) {
    const Option& a = group.options[i];
    const Option& b = group.options[best];
    const double va = a.distortion + lambda * static_cast<double>(a.bytes);
    const double vb = b.distortion + lambda * static_cast<double>(b.bytes);
    if (va < vb || (va == vb && (a.bytes < b.bytes || (a.bytes == b.bytes && a.window > b.window))))
      best = i;
  }
  return best;
}

}  // namespace

TEST_CASE("relax_at takes each head's argmin of d + lambda * bytes", "[solve]") {
  std::mt19937_64 rng(5);
  int checked = 0;
  for (int instance = 0; instance < 2000; ++instance) {
    const auto groups = random_small_instance(rng);
    // Dyadic multipliers: every d + lambda * b is exact, so ties are real ties.
    for (double lambda : {0.0, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 64.0}) {
      const auto relaxed = relax_at(groups, lambda);
      for (size_t g = 0; g < groups.size(); ++g) {
        CHECK(relaxed.choice[g] == direct_argmin(groups[g], lambda));
        ++checked;
      }
      // Everett: the relaxed solution is optimal for the bytes it uses.
      const auto reference = brute_force(groups, relaxed.total_bytes);
      REQUIRE(reference);
      CHECK(relaxed.total_distortion == reference->distortion);
    }
  }
  CHECK(checked > 20000);
  CHECK_THROWS_AS(relax_at({{0, 0, {{1, 1, 0.0}}}}, -1.0), InputError);
  CHECK_THROWS_AS(relax_at({{0, 0, {{1, 1, 0.0}}}}, std::nan("")), InputError);
}

TEST_CASE("min_fitting_lambda is the smallest multiplier that fits", "[solve]") {
  std::mt19937_64 rng(6);
  int positive = 0;
  for (int instance = 0; instance < 2000; ++instance) {
    const auto groups = random_small_instance(rng);
    for (int64_t budget : interesting_budgets(groups, rng)) {
      if (budget < min_total_bytes(groups)) {
        CHECK_THROWS_AS(min_fitting_lambda(groups, budget), InfeasibleError);
        continue;
      }
      const double lambda = min_fitting_lambda(groups, budget);
      CHECK(lambda >= 0.0);
      CHECK(relax_at(groups, lambda).total_bytes <= budget);
      if (lambda > 0.0) {
        ++positive;
        // Just below: the relaxed bytes jump back over the budget.
        CHECK(relax_at(groups, std::nextafter(lambda, 0.0)).total_bytes > budget);
      }
    }
  }
  CHECK(positive > 1000);
}

TEST_CASE("relaxed bytes never grow with lambda on realistic curves", "[solve]") {
  const auto groups = make_benchmark_groups(16, 8, 6, 3, 4);
  int64_t previous = std::numeric_limits<int64_t>::max();
  double previous_distortion = 0.0;
  for (double lambda = 1e-16; lambda < 1e-6; lambda *= 1.5) {
    const auto relaxed = relax_at(groups, lambda);
    CHECK(relaxed.total_bytes <= previous);
    CHECK(relaxed.total_distortion >= previous_distortion);
    previous = relaxed.total_bytes;
    previous_distortion = relaxed.total_distortion;
  }
  // The exact solver never does worse than the Lagrangian one at the same budget.
  const int64_t budget = max_window_total_bytes(groups) / 3;
  const auto relaxed = relax_at(groups, min_fitting_lambda(groups, budget));
  const auto exact = solve_exact(groups, budget);
  CHECK(exact.total_distortion <= relaxed.total_distortion);
  CHECK(relaxed.total_bytes <= budget);
}

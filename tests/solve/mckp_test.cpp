#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "brute_force.hpp"
#include "headwise/core/error.hpp"
#include "headwise/solve/mckp.hpp"

using namespace headwise;
using namespace headwise::solve;
using namespace headwise::solve::testing;

namespace {

bool is_free_upgrade_left(const std::vector<Group>& groups, const SolveResult& result,
                          int64_t budget) {
  const int64_t slack = budget - result.total_bytes;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Option& current = groups[g].options[result.choice[g]];
    for (const auto& option : groups[g].options) {
      if (option.bytes > current.bytes && option.bytes - current.bytes <= slack &&
          option.distortion <= current.distortion) {
        return true;
      }
    }
  }
  return false;
}

void check_totals(const std::vector<Group>& groups, const SolveResult& result) {
  REQUIRE(result.choice.size() == groups.size());
  int64_t bytes = 0;
  double distortion = 0.0;
  for (size_t g = 0; g < groups.size(); ++g) {
    REQUIRE(result.choice[g] < groups[g].options.size());
    bytes += groups[g].options[result.choice[g]].bytes;
    distortion += groups[g].options[result.choice[g]].distortion;
  }
  CHECK(result.total_bytes == bytes);
  CHECK(result.total_distortion == distortion);
}

}  // namespace

TEST_CASE("exact solver equals brute force on random small instances", "[solve]") {
  std::mt19937_64 rng(20240601);
  int compared = 0, infeasible = 0, full = 0;
  for (int instance = 0; instance < 4000; ++instance) {
    const auto groups = random_small_instance(rng);
    for (int64_t budget : interesting_budgets(groups, rng)) {
      const auto reference = brute_force(groups, budget);
      if (!reference) {
        CHECK_THROWS_AS(solve_exact(groups, budget), InfeasibleError);
        ++infeasible;
        continue;
      }
      const SolveResult plain = solve_exact(groups, budget, {.spend_leftover = false});
      const SolveResult spent = solve_exact(groups, budget);
      check_totals(groups, plain);
      check_totals(groups, spent);
      CHECK(plain.total_bytes <= budget);
      CHECK(spent.total_bytes <= budget);
      if (budget >= max_window_total_bytes(groups)) {
        // Full KV fits: largest windows everywhere, optimal only if the curves agree.
        ++full;
        for (size_t g = 0; g < groups.size(); ++g) {
          const auto& options = groups[g].options;
          const auto largest = std::max_element(
              options.begin(), options.end(),
              [](const Option& a, const Option& b) { return a.window < b.window; });
          CHECK(spent.choice[g] == static_cast<size_t>(largest - options.begin()));
        }
        CHECK(spent.proven_optimal == (spent.total_distortion == reference->distortion));
        continue;
      }
      ++compared;
      INFO("instance " << instance << " budget " << budget);
      CHECK(plain.proven_optimal);
      CHECK(plain.total_distortion == reference->distortion);
      CHECK(plain.total_bytes == reference->bytes);  // ties: the fewest bytes
      CHECK(spent.total_distortion == reference->distortion);
      CHECK_FALSE(is_free_upgrade_left(groups, spent, budget));
    }
  }
  CHECK(compared > 10000);
  CHECK(infeasible > 3000);
  CHECK(full > 3000);
}

TEST_CASE("infeasible budgets name the minimum", "[solve]") {
  const std::vector<Group> groups = {
      {0, 0, {{1024, 300, 1.0}, {kFullWindow, 900, 0.0}}},
      {0, 1, {{1024, 200, 2.0}, {4096, 500, 0.5}, {kFullWindow, 900, 0.0}}},
  };
  CHECK(min_total_bytes(groups) == 500);
  try {
    solve_exact(groups, 499);
    FAIL("accepted a budget below the minimum");
  } catch (const InfeasibleError& e) {
    CHECK_THAT(e.what(), Catch::Contains("500 B"));
  }
  CHECK(solve_exact(groups, 500).choice == std::vector<size_t>{0, 0});
}

TEST_CASE("budget at full KV gives the largest window everywhere", "[solve]") {
  // A noisy curve where 4096 reads lower than full: full still wins when it fits.
  const std::vector<Group> groups = {
      {3, 0, {{kFullWindow, 900, 0.001}, {1024, 300, 1.0}, {4096, 500, 0.0}}},
      {3, 1, {{1024, 200, 2.0}, {kFullWindow, 900, 0.0}}},
  };
  const auto result = solve_exact(groups, 1800);
  CHECK(result.choice == std::vector<size_t>{0, 1});
  CHECK(result.total_bytes == 1800);
  CHECK_FALSE(result.proven_optimal);
  // One byte less: the exact optimum, and the leftover goes nowhere it would cost distortion.
  const auto below = solve_exact(groups, 1799);
  CHECK(below.choice == std::vector<size_t>{2, 1});
  CHECK(below.proven_optimal);
}

TEST_CASE("leftover budget buys free upgrades, level by level in group order", "[solve]") {
  // Curves that read 0 beyond the calibration length: 16k, 64k and full all cost nothing.
  auto head = [](int64_t layer) {
    return Group{
        layer, 0, {{1024, 1, 3.0}, {16384, 16, 0.0}, {65536, 64, 0.0}, {kFullWindow, 160, 0.0}}};
  };
  const std::vector<Group> groups = {head(0), head(1), head(2)};
  const auto lean = solve_exact(groups, 200, {.spend_leftover = false});
  CHECK(lean.choice == std::vector<size_t>{1, 1, 1});
  CHECK(lean.total_distortion == 0.0);
  // 200 - 48 = 152 left: every head to 64k first (+144), then no full fits.
  CHECK(solve_exact(groups, 200).choice == std::vector<size_t>{2, 2, 2});
  // 352 - 192 = 160 left after 64k everywhere... then +96 for the first head's full.
  CHECK(solve_exact(groups, 352).choice == std::vector<size_t>{3, 2, 2});
}

TEST_CASE("equal bytes and distortion prefer the larger window", "[solve]") {
  // At context 160k, window 160k and full hold the same bytes.
  const std::vector<Group> groups = {
      {0, 0, {{163840, 1000, 0.0}, {kFullWindow, 1000, 0.0}, {1024, 10, 5.0}}},
      {0, 1, {{1024, 10, 1.0}, {2048, 20, 0.5}}},
  };
  const auto result = solve_exact(groups, 1015, {.spend_leftover = false});
  CHECK(result.choice == std::vector<size_t>{1, 0});
  CHECK(relax_at(groups, 0.0).choice[0] == 1);
}

TEST_CASE("input validation names the layer and head", "[solve]") {
  auto expect_error = [](std::vector<Group> groups, const std::string& fragment) {
    try {
      solve_exact(groups, 1 << 20);
      FAIL("accepted bad input: " << fragment);
    } catch (const InputError& e) {
      CHECK_THAT(e.what(), Catch::Contains("layer 7 KV head 2") && Catch::Contains(fragment));
    }
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error({{7, 2, {}}}, "no window options");
  expect_error({{7, 2, {{1024, -5, 0.1}}}}, "negative bytes");
  expect_error({{7, 2, {{1024, 5, nan}}}}, "distortion");
  expect_error({{7, 2, {{1024, 5, -0.5}}}}, "distortion");
  expect_error({{7, 2, {{1024, 5, std::numeric_limits<double>::infinity()}}}}, "distortion");
  expect_error({{7, 2, {{1024, 5, 0.1}, {1024, 9, 0.0}}}}, "window 1024 listed twice");
  expect_error({{7, 2, {{kFullWindow, 5, 0.1}, {kFullWindow, 9, 0.0}}}},
               "window full listed twice");
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2 + 1;
  try {
    solve_exact({{0, 0, {{1, huge, 0.0}}}, {7, 2, {{1, huge, 0.0}}}}, 1);
    FAIL("accepted overflowing bytes");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("overflow"));
  }
}

TEST_CASE("an empty problem is solved trivially", "[solve]") {
  const auto result = solve_exact({}, 0);
  CHECK(result.choice.empty());
  CHECK(result.total_bytes == 0);
  CHECK(result.proven_optimal);
}

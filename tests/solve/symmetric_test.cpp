// solve::solve_symmetric: the exact optimum under tensor parallelism's constraint (every rank's
// shard of a layer holds the same multiset of windows), checked against exhaustive enumeration
// of every per-head assignment that satisfies it, and against the unconstrained optimum.
#include <catch2/catch.hpp>

#include <limits>
#include <map>
#include <random>

#include "headwise/core/error.hpp"
#include "headwise/memory/tensor_parallel.hpp"
#include "headwise/solve/mckp.hpp"
#include "headwise/solve/symmetric.hpp"

using namespace headwise;
using namespace headwise::solve;

namespace {

std::vector<Group> random_groups(int layers, int heads, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> d(0.0, 1.0);
  const std::vector<int64_t> windows = {64, 256, 1024, kFullWindow};
  const std::vector<int64_t> bytes = {1, 4, 16, 40};
  std::vector<Group> groups;
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      Group g{2 * l + 1, h, {}};
      double cost = d(rng) * 4.0;
      for (size_t w = 0; w < windows.size(); ++w) {
        g.options.push_back({windows[w], bytes[w], w + 1 == windows.size() ? 0.0 : cost});
        cost *= d(rng);  // non-increasing, not convex
      }
      groups.push_back(g);
    }
  }
  return groups;
}

bool symmetric(const std::vector<Group>& groups, const std::vector<size_t>& choice, int64_t tp) {
  std::map<int64_t, std::vector<int64_t>> layers;
  for (size_t g = 0; g < groups.size(); ++g)
    layers[groups[g].layer_id].push_back(groups[g].options[choice[g]].window);
  for (const auto& [layer, windows] : layers)
    if (memory::shard_mismatch(windows, tp)) return false;
  return true;
}

// Every per-head assignment: the least distortion under the budget, with or without symmetry.
double brute_force(const std::vector<Group>& groups, int64_t budget, int64_t tp) {
  std::vector<size_t> choice(groups.size(), 0);
  double best = std::numeric_limits<double>::infinity();
  while (true) {
    int64_t bytes = 0;
    double distortion = 0.0;
    for (size_t g = 0; g < groups.size(); ++g) {
      bytes += groups[g].options[choice[g]].bytes;
      distortion += groups[g].options[choice[g]].distortion;
    }
    if (bytes <= budget && distortion < best && (tp == 1 || symmetric(groups, choice, tp)))
      best = distortion;
    size_t g = 0;
    while (g < groups.size() && ++choice[g] == groups[g].options.size()) choice[g++] = 0;
    if (g == groups.size()) break;
  }
  return best;
}

}  // namespace

TEST_CASE("symmetric solve: exact against exhaustive enumeration", "[solve]") {
  std::mt19937_64 rng(57);
  for (int trial = 0; trial < 12; ++trial) {
    const auto groups = random_groups(2, 4, rng);  // 4^8 = 65,536 assignments
    const int64_t full = 8 * 40;
    for (int64_t budget : {int64_t{8}, full / 4, full / 2, full}) {
      const double free_optimum = brute_force(groups, budget, 1);
      const SolveResult free = solve_exact(groups, budget);
      CHECK(free.total_distortion == Approx(free_optimum).margin(1e-12));
      for (int64_t tp : {2, 4}) {
        const SymmetricResult s = solve_symmetric(groups, tp, budget);
        const double optimum = brute_force(groups, budget, tp);
        INFO("trial " << trial << " budget " << budget << " tp " << tp);
        CHECK(s.result.proven_optimal);
        CHECK(s.result.total_bytes <= budget);
        CHECK(symmetric(groups, s.result.choice, tp));
        CHECK(s.result.total_distortion == Approx(optimum).margin(1e-12));
        // The constraint never helps: the loss is >= 0.
        CHECK(s.result.total_distortion >= free.total_distortion - 1e-12);
      }
    }
  }
}

TEST_CASE("symmetric solve: replicated KV heads share a window; bad input", "[solve]") {
  std::mt19937_64 rng(5);
  const auto groups = random_groups(2, 2, rng);  // 2 KV heads, 4 ranks: 2 replicas each
  const SymmetricResult s = solve_symmetric(groups, 4, 2 * 2 * 16);
  CHECK(symmetric(groups, s.result.choice, 4));
  for (size_t g = 0; g < groups.size(); g += 2) CHECK(s.result.choice[g] == s.result.choice[g + 1]);
  CHECK(s.result.total_distortion == Approx(brute_force(groups, 2 * 2 * 16, 4)).margin(1e-12));
  CHECK_THROWS_AS(solve_symmetric(random_groups(1, 3, rng), 2, 1000), InputError);
  CHECK_THROWS_AS(solve_symmetric(groups, 4, 1), InfeasibleError);
  // TP=1 is the unconstrained solve.
  const auto four = random_groups(2, 4, rng);
  CHECK(solve_symmetric(four, 1, 100).result.total_distortion ==
        Approx(solve_exact(four, 100).total_distortion).margin(1e-12));
}

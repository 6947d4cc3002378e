// calib::fit_tensor_parallel: the walk's windows re-solved under tensor parallelism's constraint
// over its conditioned curves, beside the unconstrained optimum at the same budget.
#include <catch2/catch.hpp>

#include "headwise/calib/tensor_parallel.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/tensor_parallel.hpp"

using namespace headwise;

TEST_CASE("fit_tensor_parallel: shards the walk's windows at least cost", "[calib]") {
  // One layer of 4 heads, levels 64 / 256 / full at 1 / 4 / 16 units. Heads 0 and 1 (rank 0)
  // need long windows, heads 2 and 3 (rank 1) do not: unconstrained, the budget goes to rank 0's
  // heads; constrained, each rank must hold the same multiset.
  std::vector<calib::HeadCurve> curves;
  const std::vector<double> need = {3.0, 2.0, 0.5, 0.1};
  for (int64_t h = 0; h < 4; ++h)
    curves.push_back({1, h, {64, 256, kFullWindow}, {1, 4, 16}, {need[h], need[h] / 4, 0.0}});
  const std::map<int64_t, std::vector<int64_t>> walk = {{1, {kFullWindow, 256, 64, 64}}};
  const std::map<int64_t, std::vector<double>> walk_d = {{1, {0.0, 0.5, 0.5, 0.1}}};
  const auto fit = calib::fit_tensor_parallel(curves, walk, walk_d, 2, 10);
  CHECK_FALSE(fit.walk_already_shards);
  CHECK_FALSE(memory::first_unshardable_layer(
      memory::HeadWindows(fit.windows.begin(), fit.windows.end()), 2));
  CHECK(fit.global_bytes <= 10);
  // Unconstrained at 10: heads 0 and 1 at 256 (8), heads 2 and 3 at 64: 0.75 + 0.5 + 0.5 + 0.1.
  CHECK(fit.unconstrained_distortion == Approx(1.85));
  // Constrained: the multiset {256, 64} per rank (10 units; {256, 256} takes 16): rank 0 gives
  // 256 to head 0 (0.75) and 64 to head 1 (2), rank 1 256 to head 2 (0.125) and 64 to head 3
  // (0.1): 2.975.
  CHECK(fit.distortion == Approx(2.975));
  CHECK(fit.distortion_lost() == Approx(1.125));
  CHECK(fit.windows.at(1) == std::vector<int64_t>{256, 64, 256, 64});
  CHECK(fit.expected_distortion.at(1)[0] == Approx(0.75));
  // A walk that already shards and costs no more is kept as measured.
  const std::map<int64_t, std::vector<int64_t>> sharded = {{1, {256, 64, 256, 64}}};
  const auto kept = calib::fit_tensor_parallel(curves, sharded, walk_d, 2, 10);
  CHECK(kept.walk_already_shards);
  CHECK(kept.heads_moved == 0);
  CHECK(kept.windows == sharded);
  CHECK(calib::fit_tensor_parallel(curves, walk, walk_d, 1, 10).windows == walk);
  CHECK_THROWS_AS(calib::fit_tensor_parallel(curves, walk, walk_d, 3, 10), InputError);
}

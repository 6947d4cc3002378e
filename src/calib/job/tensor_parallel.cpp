#include "headwise/calib/tensor_parallel.hpp"

#include "headwise/calib/curve_groups.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/tensor_parallel.hpp"
#include "headwise/solve/mckp.hpp"
#include "headwise/solve/symmetric.hpp"

namespace headwise::calib {
namespace {

// The curves' distortion and bytes at `windows` (heads missing from the curves cost nothing).
std::pair<double, int64_t> price(const std::vector<HeadCurve>& curves,
                                 const std::map<int64_t, std::vector<int64_t>>& windows) {
  double d = 0.0;
  int64_t b = 0;
  for (const auto& c : curves) {
    const int64_t w = windows.at(c.layer_id).at(static_cast<size_t>(c.kv_head));
    for (size_t l = 0; l < c.windows.size(); ++l) {
      if (c.windows[l] == w) {
        d += c.distortion[l];
        b += c.bytes[l];
      }
    }
  }
  return {d, b};
}

}  // namespace

TensorParallelFit fit_tensor_parallel(const std::vector<HeadCurve>& curves,
                                      const std::map<int64_t, std::vector<int64_t>>& windows,
                                      const std::map<int64_t, std::vector<double>>& distortion,
                                      int64_t tensor_parallel_size, int64_t global_budget) {
  TensorParallelFit fit;
  fit.tensor_parallel_size = tensor_parallel_size;
  fit.windows = windows;
  fit.expected_distortion = distortion;
  const auto [walk_d, walk_b] = price(curves, windows);
  fit.walk_distortion = walk_d;
  fit.global_bytes = walk_b;
  fit.distortion = walk_d;
  if (tensor_parallel_size == 1 || curves.empty()) {
    fit.walk_already_shards = true;
    return fit;
  }
  const auto groups = curve_groups(curves);
  const solve::SolveResult free = solve::solve_exact(groups, global_budget);
  fit.unconstrained_distortion = free.total_distortion;
  fit.unconstrained_bytes = free.total_bytes;
  const solve::SymmetricResult sym =
      solve::solve_symmetric(groups, tensor_parallel_size, global_budget);
  fit.proven_optimal = sym.result.proven_optimal && free.proven_optimal;
  fit.walk_already_shards =
      !memory::first_unshardable_layer(memory::HeadWindows(windows.begin(), windows.end()),
                                       tensor_parallel_size)
           .has_value();
  // The walk's windows were measured end to end: keep them when they shard and cost no more by
  // the curves than the constrained optimum.
  if (fit.walk_already_shards && walk_d <= sym.result.total_distortion) return fit;
  fit.distortion = sym.result.total_distortion;
  fit.global_bytes = sym.result.total_bytes;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& o = groups[g].options[sym.result.choice[g]];
    const size_t h = static_cast<size_t>(groups[g].kv_head);
    auto& w = fit.windows.at(groups[g].layer_id).at(h);
    if (w != o.window) ++fit.heads_moved;
    w = o.window;
    auto& d = fit.expected_distortion[groups[g].layer_id];
    if (d.size() <= h) d.resize(fit.windows.at(groups[g].layer_id).size(), 0.0);
    d[h] = o.distortion;
  }
  return fit;
}

}  // namespace headwise::calib

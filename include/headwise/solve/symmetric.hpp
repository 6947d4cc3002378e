#pragma once
// The window allocation under tensor parallelism's constraint (issue 57): vLLM builds one KV
// cache layout for every tensor-parallel rank, so every rank's shard of a global layer's KV heads
// must hold the same multiset of windows (memory/tensor_parallel.hpp: rank r holds the contiguous
// heads [r*k, (r+1)*k), k = heads / ranks; below the rank count each rank holds one replicated
// head, so every head of such a layer shares one window).
//
// Exact, as solve_exact is: each layer becomes one group whose options are the multisets M of k
// ladder levels; an option's cost is, per shard, the least distortion of any assignment of the
// shard's heads to M's levels (an exact minimum-cost assignment over subsets of the shard), summed
// over the shards, and its bytes the assigned heads' bytes. solve_exact over these groups is then
// the constrained optimum at the same budget; the unconstrained optimum is solve_exact over the
// per-head groups, and the difference is the distortion the constraint costs.
#include <cstdint>
#include <vector>

#include "headwise/solve/mckp.hpp"

namespace headwise::solve {

struct SymmetricResult {
  // As solve_exact's, indexed like the input groups: the option each head took.
  SolveResult result;
  int64_t tensor_parallel_size = 1;
  size_t layer_options = 0;  // multisets enumerated over all layers
};

// The per-head groups of every global layer (one Group per KV head, kv_head 0..n-1 per layer,
// every head of a layer offering the same windows) solved under the symmetric-shard constraint.
// InputError when a layer's heads do not shard over tensor_parallel_size or offer different
// windows, or when a layer has more than max_layer_options multisets; InfeasibleError (with the
// minimum) when the budget is below every head's smallest window.
SymmetricResult solve_symmetric(const std::vector<Group>& groups, int64_t tensor_parallel_size,
                                int64_t budget, const SolveOptions& options = {},
                                size_t max_layer_options = 200000);

}  // namespace headwise::solve

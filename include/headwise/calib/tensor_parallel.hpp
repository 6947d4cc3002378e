#pragma once
// Calibrating for vLLM's tensor parallelism (calibrate --tensor-parallel-size N, issue 57): vLLM
// builds one KV cache layout for every rank, so every rank's shard of a global layer's KV heads
// must hold the same multiset of windows (memory/tensor_parallel.hpp). The walk decides every
// layer under that constraint (calib/walk/shard_constraint.hpp), so its windows shard; this fit
// then checks them against the exact constrained optimum over the walk's conditioned curves at
// the same global budget (solve::solve_symmetric: each layer's windows a multiset per shard,
// within each shard the heads assigned to its levels at the least measured cost), takes that
// optimum where the walk's windows do not shard (a policy completed from stored curves), and
// solves the unconstrained optimum over the same curves, so the report states what the
// constraint costs (in the measure's units, summed over heads).
#include <cstdint>
#include <map>
#include <vector>

#include "headwise/calib/seqcalib.hpp"

namespace headwise::calib {

struct TensorParallelFit {
  int64_t tensor_parallel_size = 1;
  std::map<int64_t, std::vector<int64_t>> windows;  // global layer -> window per KV head
  std::map<int64_t, std::vector<double>> expected_distortion;
  int64_t global_bytes = 0;
  double distortion = 0.0;                // constrained optimum, summed over heads
  double unconstrained_distortion = 0.0;  // the exact optimum without the constraint
  int64_t unconstrained_bytes = 0;
  double walk_distortion = 0.0;  // the walk's own windows on the same curves
  bool proven_optimal = true;
  int64_t heads_moved = 0;  // heads whose window differs from the walk's
  bool walk_already_shards = false;

  double distortion_lost() const { return distortion - unconstrained_distortion; }
};

// The constrained re-solve. When the walk's windows already shard, they are kept (the measured
// policy), and the constrained optimum is still reported beside them. tensor_parallel_size 1
// returns the walk's windows. InputError when a layer's heads do not shard over the size;
// InfeasibleError when nothing fits the budget.
TensorParallelFit fit_tensor_parallel(const std::vector<HeadCurve>& curves,
                                      const std::map<int64_t, std::vector<int64_t>>& windows,
                                      const std::map<int64_t, std::vector<double>>& distortion,
                                      int64_t tensor_parallel_size, int64_t global_budget);

}  // namespace headwise::calib

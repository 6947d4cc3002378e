#pragma once
// The walk under tensor parallelism's constraint (--tensor-parallel-size N, issue 57): vLLM builds
// one KV cache layout for every rank, so every rank's shard of a global layer's KV heads must hold
// the same multiset of windows (memory/tensor_parallel.hpp). Deciding each layer within that
// constraint, as the walk goes, keeps SeqCalib's conditioning true: the layers above are measured
// on the stream of the windows that will be served, not on windows the post-walk fit later moves.
// Every solve of the run (each layer's decision, the unconditioned plan, the completion and the
// cross-layer re-solve) goes through solve_within_shards; at N = 1 each is the solve it was.
#include <cstdint>
#include <vector>

#include "calib/walk/joint_descent.hpp"
#include "calib/walk/seqcalib_run.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib::seqcalib {

// Whether the run decides under a tensor-parallel constraint (N > 1).
bool constrained_to_shards(const RunInputs& in);

// solve_exact at N = 1; under N > 1 the exact optimum among the assignments whose shards hold the
// same multiset (solve::solve_symmetric), `groups` being whole layers' per-head groups.
solve::SolveResult solve_within_shards(const RunInputs& in, const std::vector<solve::Group>& groups,
                                       int64_t budget);

// One layer's decision by curves: the least sum of distortion + price·bytes within `allowance`
// among the assignments that shard (the Lagrangian decision relax_at takes without the
// constraint). `price` not finite: 0.
std::vector<size_t> shard_relaxed_choice(const RunInputs& in,
                                         const std::vector<solve::Group>& groups, int64_t allowance,
                                         double price);

// One layer's joint decision under the constraint: `assign` itself when its shards already hold
// the same multiset; otherwise, among the assignments that shard and fit `allowance`, the least
// J = joint + price·bytes, measured jointly when there are at most kMeasuredShardAssignments of
// them (one batch through `prefetch`), else the curves' symmetric optimum (shard_relaxed_choice)
// measured against the within-shard permutations of its levels.
constexpr size_t kMeasuredShardAssignments = 64;
std::vector<size_t> shard_joint_choice(const RunInputs& in, int64_t layer_id,
                                       const std::vector<solve::Group>& groups, int64_t allowance,
                                       double price, const std::vector<size_t>& assign,
                                       const JointMeasure& joint, const JointPrefetch& prefetch);

}  // namespace headwise::calib::seqcalib

#pragma once
// A decision that does not move with the calibration seed (issue 59, `--decisions stable`).
//
// The point decision takes the candidate with the least measured objective J = D + penalty (D the
// pooled answer divergence over the calibration sequences). Where the runner-up is worse by less
// than its sampling noise, another draw of sequences picks another candidate, and the policy moves
// with the seed. The stable rule instead takes, in a fixed order of preference that no measurement
// chooses, the first candidate that the data do not separate from the point best. Separated means
// both: a paired t-test of the gap J(c) − J(best) at 5% (two-sided), its standard error the
// bootstrap's (each replicate redraws the N sequences and recomputes both pooled means on the same
// draw), widened by sqrt(N/(N−1)) and compared with Student's t for N − 1 degrees of freedom (2.52
// standard errors at N = 8); and a sign test: c is worse on at least 7 of 8 sequences (13 of 16).
// Why both: at N = 8 the bootstrap's interval is too narrow for the seeds' spread, because one or
// two sequences whose needles a head happens to hold carry a gap (measured on the 8K default model
// at 25%: with the t-test alone, seeds 0-1 and seeds 2-4 each separated, in opposite directions,
// the layer-3 assignments that cut head 0 and head 1). Candidates that the data tell apart on
// most sequences are decided by the data; among the others, the order decides, the same under
// every seed.
#include <cstdint>
#include <vector>

#include "headwise/calib/sequence_values.hpp"

namespace headwise::calib::noise {

inline constexpr size_t kStableReplicates = 2000;
inline constexpr double kStableNormalQuantile = 1.959963984540054;  // two-sided 5%
inline constexpr double kSignTail = 0.05;  // one-sided: 7 of 8 sequences, 13 of 16

// Student's t quantile for `df` degrees of freedom at the normal quantile z (Cornish-Fisher, within
// 0.01 of the table from 5 degrees of freedom on).
double t_quantile(double z, double df);

struct StableCandidate {
  const SequenceValues* values = nullptr;  // per calibration sequence (never nullptr)
  double penalty = 0.0;                    // added to the pooled mean: λ·bytes, or 0
};

struct StableChoice {
  size_t chosen = 0;  // index of the candidate taken
  size_t best = 0;    // index of the least point objective (ties: the earlier one)
  // Candidates before `best` in the order that the bootstrap separated (worse than the best).
  size_t separated_before = 0;
};

// `candidates` in the order of preference (most preferred first; at least one). Deterministic in
// `seed` (bootstrap.hpp's draws).
StableChoice stable_choice(const std::vector<StableCandidate>& candidates, uint64_t seed,
                           size_t replicates = kStableReplicates);

}  // namespace headwise::calib::noise

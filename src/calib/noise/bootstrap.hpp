#pragma once
// How sure a layer's decision is (issue 59): a bootstrap over the calibration sequences.
//
// An answer measure's value of a candidate is the mean divergence per answer position, pooled over
// the sequences: Σ_s sum_s / Σ_s answers_s, where sum_s is the divergence summed over sequence s's
// answer positions and answers_s their count. A bootstrap replicate draws N sequences out of the N
// with replacement (weights w_s = how often s was drawn, Σ w_s = N) and recomputes the same pooled
// mean, Σ_s w_s sum_s / Σ_s w_s answers_s, for every candidate with the same draw, so that the
// replicates of a difference between two candidates keep their pairing (the same sequences).
//
// The draws are deterministic: a splitmix64 stream from a seed (decision_seed: the calibration
// sequences' tokens, which the calibration seed chose, and the layer), each index the high 64 bits
// of a 64x64-bit product (no rejection: a bias below N / 2^64). The interval is the percentile
// interval of the replicates (linear interpolation between order statistics, R's type 7).
#include <cstdint>
#include <vector>

#include "headwise/calib/sequence_values.hpp"

namespace headwise::calib::noise {

// The pooled mean Σ_s sum_s / Σ_s answers_s (NaN when no answer position).
double pooled_mean(const SequenceValues& values);

// The same with each sequence counted weights[s] times (NaN when the weighted answers are 0).
double weighted_mean(const SequenceValues& values, const std::vector<uint32_t>& weights);

// `replicates` draws of `sequences` indices with replacement, as weights (how often each index
// was drawn); deterministic in `seed`.
std::vector<std::vector<uint32_t>> bootstrap_weights(size_t sequences, size_t replicates,
                                                     uint64_t seed);

// The q-quantile (0 ≤ q ≤ 1) of `samples`, linear between order statistics (type 7); NaN when
// empty.
double quantile(std::vector<double> samples, double q);

// The unbiased variance of `samples` (the squares about their mean over n − 1); NaN with fewer than
// two. The bootstrap's spread of a gap, for the decision noise and the stable rule alike.
double sample_variance(const std::vector<double>& samples);

// A seed for one layer's bootstrap: FNV-1a over the calibration tokens, mixed with the layer id.
uint64_t decision_seed(const std::vector<std::vector<int64_t>>& sequences, int64_t layer_id);

// The pooled means of `values` (every candidate) under one bootstrap replicate's weights.
std::vector<double> replicate_means(const std::vector<const SequenceValues*>& values,
                                    const std::vector<uint32_t>& weights);

}  // namespace headwise::calib::noise

#include "calib/noise/stable_choice.hpp"

#include <cmath>

#include "calib/noise/bootstrap.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib::noise {
namespace {

// The least k with P(X >= k) <= 5% for X ~ Binomial(n, 1/2): how many of n sequences must agree.
size_t sign_threshold(size_t n) {
  std::vector<double> tail(n + 2, 0.0);  // tail[k] = P(X >= k)
  double p = std::pow(0.5, static_cast<double>(n));
  std::vector<double> pmf(n + 1);
  for (size_t k = 0; k <= n; ++k) {
    pmf[k] = p;
    p = p * static_cast<double>(n - k) / static_cast<double>(k + 1);
  }
  for (size_t k = n + 1; k-- > 0;) tail[k] = tail[k + 1] + pmf[k];
  for (size_t k = 0; k <= n; ++k) {
    if (tail[k] <= kSignTail) return k;
  }
  return n + 1;  // never
}

// Whether candidate c is separated from the best: its measured gap is at least `least_gap` (the
// minimum effect, on the layer's scale) and above 0 by more than t
// standard errors (the replicates' standard deviation, widened by sqrt(N/(N−1))), and it is worse
// on so many sequences (each sequence's own mean over its answers) that a fair coin would be so
// lopsided in at most 5% of draws. The second part keeps one or two sequences, whose needles one
// head happens to hold, from separating heads that the other sequences cannot tell apart.
bool separated(const StableCandidate& c, const StableCandidate& best, double gap, double least_gap,
               const std::vector<double>& gaps, size_t sequences) {
  if (gaps.size() < 2 || sequences < 2 || !(gap >= least_gap)) return false;
  const double n = static_cast<double>(sequences);
  const double se = std::sqrt(sample_variance(gaps) * n / (n - 1.0));
  if (!(gap > t_quantile(kStableNormalQuantile, n - 1.0) * se)) return false;
  size_t counted = 0, worse = 0;
  for (size_t s = 0; s < sequences; ++s) {
    if (c.values->answers[s] == 0 || best.values->answers[s] == 0) continue;
    ++counted;
    const double vc = c.values->sums[s] / static_cast<double>(c.values->answers[s]) + c.penalty;
    const double vb =
        best.values->sums[s] / static_cast<double>(best.values->answers[s]) + best.penalty;
    worse += vc > vb ? 1 : 0;
  }
  return worse >= sign_threshold(counted);
}

}  // namespace

double t_quantile(double z, double df) {
  const double z3 = z * z * z, z5 = z3 * z * z;
  return z + (z3 + z) / (4.0 * df) + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * df * df);
}

bool worse_by_effect(double value, double least, double min_effect) {
  HEADWISE_CHECK(min_effect >= 0.0, "stable choice: minimum effect {} below 0", min_effect);
  return value - least > min_effect * std::abs(least);
}

bool stable_refinement_kept(double before, double after) {
  return before - after >= kStableRefinementEffect * std::abs(before);
}

StableChoice stable_choice(const std::vector<StableCandidate>& candidates, uint64_t seed,
                           size_t replicates, double min_effect) {
  HEADWISE_CHECK(!candidates.empty(), "stable choice: no candidates");
  const size_t sequences = candidates.front().values->sums.size();
  StableChoice out;
  std::vector<double> point(candidates.size());
  double best_j = INFINITY;
  for (size_t c = 0; c < candidates.size(); ++c) {
    HEADWISE_CHECK(
        candidates[c].values != nullptr && candidates[c].values->sums.size() == sequences,
        "stable choice: candidate {} has no values for the {} sequences", c, sequences);
    const double j = point[c] = pooled_mean(*candidates[c].values) + candidates[c].penalty;
    if (j < best_j) {
      best_j = j;
      out.best = c;
    }
  }
  out.chosen = out.best;
  if (out.best == 0) return out;  // the most preferred is the best itself
  const double least_gap = min_effect * std::abs(best_j - candidates[out.best].penalty);
  const auto weights = bootstrap_weights(sequences, replicates, seed);
  std::vector<double> best_reps;
  best_reps.reserve(weights.size());
  for (const auto& w : weights) best_reps.push_back(weighted_mean(*candidates[out.best].values, w));
  for (size_t c = 0; c < out.best; ++c) {
    std::vector<double> gaps;
    gaps.reserve(weights.size());
    for (size_t r = 0; r < weights.size(); ++r) {
      const double d = weighted_mean(*candidates[c].values, weights[r]);
      if (std::isnan(d) || std::isnan(best_reps[r])) continue;
      gaps.push_back(d + candidates[c].penalty - best_reps[r] - candidates[out.best].penalty);
    }
    if (!separated(candidates[c], candidates[out.best], point[c] - best_j, least_gap, gaps,
                   sequences)) {
      out.chosen = c;
      return out;
    }
    ++out.separated_before;
  }
  return out;
}

}  // namespace headwise::calib::noise

#include "calib/noise/decision_noise.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "calib/walk/joint_descent.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib::noise {
namespace {

std::vector<int64_t> windows_of(const std::vector<solve::Group>& groups,
                                const std::vector<size_t>& levels) {
  std::vector<int64_t> out;
  for (size_t h = 0; h < groups.size(); ++h) out.push_back(groups[h].options[levels[h]].window);
  return out;
}

}  // namespace

std::optional<DecisionNoise> decision_noise(const DecisionCandidates& in) {
  HEADWISE_CHECK(in.measured != nullptr && in.groups != nullptr, "decision noise: no candidates");
  const auto& groups = *in.groups;
  const SequenceValues* chosen_values = in.per_sequence(in.chosen);
  const auto value = in.measured->find(in.chosen);
  if (chosen_values == nullptr || value == in.measured->end()) return std::nullopt;
  const double price = std::isfinite(in.price) ? in.price : 0.0;
  const auto objective = [&](const std::vector<size_t>& levels, double d) {
    return d + price * static_cast<double>(layer_bytes(groups, levels));
  };

  // The alternatives: every other measured assignment within the allowance that has per-sequence
  // values; the runner-up is the one with the least objective (ties: the first in level order).
  std::vector<const std::vector<size_t>*> alternatives;
  std::vector<const SequenceValues*> values{chosen_values};
  std::vector<double> penalties{price * static_cast<double>(layer_bytes(groups, in.chosen))};
  size_t runner = 0;  // index into alternatives + 1 (0: none)
  double runner_objective = std::numeric_limits<double>::infinity();
  for (const auto& [levels, d] : *in.measured) {
    if (levels == in.chosen || levels.size() != groups.size()) continue;
    if (layer_bytes(groups, levels) > in.allowance) continue;
    const SequenceValues* v = in.per_sequence(levels);
    if (v == nullptr) continue;
    alternatives.push_back(&levels);
    values.push_back(v);
    penalties.push_back(price * static_cast<double>(layer_bytes(groups, levels)));
    const double j = objective(levels, d);
    if (j < runner_objective) {
      runner_objective = j;
      runner = alternatives.size();
    }
  }

  DecisionNoise out;
  out.layer_id = in.layer_id;
  out.windows = windows_of(groups, in.chosen);
  out.price = price;
  out.allowance = in.allowance;
  out.sequences = static_cast<int64_t>(chosen_values->sums.size());
  out.replicates = static_cast<int64_t>(in.replicates);
  out.value = value->second;
  out.alternatives = static_cast<int64_t>(alternatives.size());
  if (runner > 0) {
    const auto& levels = *alternatives[runner - 1];
    out.runner_up_windows = windows_of(groups, levels);
    out.runner_up_value = in.measured->at(levels);
    out.gap = runner_objective - objective(in.chosen, out.value);
  }

  const auto weights = bootstrap_weights(chosen_values->sums.size(), in.replicates, in.seed);
  std::vector<double> chosen_reps, gap_reps;
  int64_t gap_positive = 0, chosen_best = 0, counted = 0;
  for (const auto& w : weights) {
    const std::vector<double> d = replicate_means(values, w);
    if (std::isnan(d[0])) continue;
    ++counted;
    chosen_reps.push_back(d[0]);
    const double j_chosen = d[0] + penalties[0];
    bool best = true;
    for (size_t a = 1; a < d.size(); ++a) {
      if (d[a] + penalties[a] < j_chosen) best = false;
    }
    chosen_best += best ? 1 : 0;
    if (runner > 0) {
      const double gap = d[runner] + penalties[runner] - j_chosen;
      gap_reps.push_back(gap);
      gap_positive += gap > 0.0 ? 1 : 0;
    }
  }
  out.value_lower = quantile(chosen_reps, 0.025);
  out.value_upper = quantile(chosen_reps, 0.975);
  const double n = counted > 0 ? static_cast<double>(counted) : std::nan("");
  out.chosen_best_share = static_cast<double>(chosen_best) / n;
  if (runner > 0) {
    out.gap_lower = quantile(gap_reps, 0.025);
    out.gap_upper = quantile(gap_reps, 0.975);
    out.gap_positive_share = static_cast<double>(gap_positive) / n;
    out.separated = out.gap_lower > 0.0;
    double mean = 0.0, squares = 0.0;
    for (double g : gap_reps) mean += g;
    mean /= static_cast<double>(std::max<size_t>(1, gap_reps.size()));
    for (double g : gap_reps) squares += (g - mean) * (g - mean);
    out.gap_sd = gap_reps.size() > 1 ? std::sqrt(squares / static_cast<double>(gap_reps.size() - 1))
                                     : std::nan("");
    const double z = 1.96 * out.gap_sd / out.gap;
    out.sequences_to_separate =
        out.gap > 0.0 ? std::max(1.0, z * z) * static_cast<double>(out.sequences) : std::nan("");
  } else {
    out.gap_positive_share = 1.0;
    out.separated = true;  // nothing else fits the allowance: no alternative to confuse it with
  }
  return out;
}

}  // namespace headwise::calib::noise

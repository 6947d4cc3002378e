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

// The gap's statistics from its replicates (`positive`: those in which the chosen one wins).
void gap_statistics(const std::vector<double>& gaps, int64_t positive, double counted,
                    DecisionGap& out) {
  out.gap_lower = quantile(gaps, 0.025);
  out.gap_upper = quantile(gaps, 0.975);
  out.gap_positive_share = static_cast<double>(positive) / counted;
  out.separated = out.gap_lower > 0.0;
  out.gap_sd = std::sqrt(sample_variance(gaps));
  const double z = 1.96 * out.gap_sd / out.gap;
  out.sequences_to_separate =
      out.gap > 0.0 ? std::max(1.0, z * z) * static_cast<double>(out.sequences) : std::nan("");
}

}  // namespace

size_t runner_up(const std::vector<Contender>& contenders) {
  size_t runner = 0;
  double least = std::numeric_limits<double>::infinity();
  for (size_t c = 1; c < contenders.size(); ++c) {
    const double j = contenders[c].value + contenders[c].penalty;
    if (j < least) {
      least = j;
      runner = c;
    }
  }
  return runner;
}

DecisionGap decision_gap(const std::vector<Contender>& contenders, uint64_t seed,
                         size_t replicates) {
  HEADWISE_CHECK(!contenders.empty(), "decision noise: no chosen candidate");
  const size_t runner = runner_up(contenders);
  const Contender& chosen = contenders.front();
  DecisionGap out;
  out.sequences = static_cast<int64_t>(chosen.values->sums.size());
  out.replicates = static_cast<int64_t>(replicates);
  out.value = chosen.value;
  out.alternatives = static_cast<int64_t>(contenders.size() - 1);
  out.has_runner_up = runner > 0;
  if (out.has_runner_up) {
    out.runner_up_value = contenders[runner].value;
    out.gap =
        (contenders[runner].value + contenders[runner].penalty) - (chosen.value + chosen.penalty);
  }

  std::vector<const SequenceValues*> values;
  for (const Contender& c : contenders) values.push_back(c.values);
  std::vector<double> chosen_reps, gap_reps;
  int64_t gap_positive = 0, chosen_best = 0, counted = 0;
  for (const auto& w : bootstrap_weights(chosen.values->sums.size(), replicates, seed)) {
    const std::vector<double> d = replicate_means(values, w);
    if (std::isnan(d[0])) continue;
    ++counted;
    chosen_reps.push_back(d[0]);
    const double j_chosen = d[0] + chosen.penalty;
    bool best = true;
    for (size_t a = 1; a < d.size(); ++a) {
      if (d[a] + contenders[a].penalty < j_chosen) best = false;
    }
    chosen_best += best ? 1 : 0;
    if (out.has_runner_up) {
      const double gap = d[runner] + contenders[runner].penalty - j_chosen;
      gap_reps.push_back(gap);
      gap_positive += gap > 0.0 ? 1 : 0;
    }
  }
  out.value_lower = quantile(chosen_reps, 0.025);
  out.value_upper = quantile(chosen_reps, 0.975);
  const double n = counted > 0 ? static_cast<double>(counted) : std::nan("");
  out.chosen_best_share = static_cast<double>(chosen_best) / n;
  if (out.has_runner_up) {
    gap_statistics(gap_reps, gap_positive, n, out);
  } else {
    out.gap_positive_share = 1.0;
    out.separated = true;  // nothing else to weigh: no alternative to confuse it with
  }
  return out;
}

std::optional<DecisionNoise> decision_noise(const DecisionCandidates& in) {
  HEADWISE_CHECK(in.measured != nullptr && in.groups != nullptr, "decision noise: no candidates");
  const auto& groups = *in.groups;
  const SequenceValues* chosen_values = in.per_sequence(in.chosen);
  const auto value = in.measured->find(in.chosen);
  if (chosen_values == nullptr || value == in.measured->end()) return std::nullopt;
  const double price = std::isfinite(in.price) ? in.price : 0.0;
  const auto penalty = [&](const std::vector<size_t>& levels) {
    return price * static_cast<double>(layer_bytes(groups, levels));
  };

  // The alternatives: every other measured assignment within the allowance that has per-sequence
  // values.
  std::vector<const std::vector<size_t>*> assignments{&in.chosen};
  std::vector<Contender> contenders{{chosen_values, value->second, penalty(in.chosen)}};
  for (const auto& [levels, d] : *in.measured) {
    if (levels == in.chosen || levels.size() != groups.size()) continue;
    if (layer_bytes(groups, levels) > in.allowance) continue;
    const SequenceValues* v = in.per_sequence(levels);
    if (v == nullptr) continue;
    assignments.push_back(&levels);
    contenders.push_back({v, d, penalty(levels)});
  }

  DecisionNoise out;
  static_cast<DecisionGap&>(out) = decision_gap(contenders, in.seed, in.replicates);
  out.layer_id = in.layer_id;
  out.windows = windows_of(groups, in.chosen);
  out.price = price;
  out.allowance = in.allowance;
  if (const size_t runner = runner_up(contenders); runner > 0)
    out.runner_up_windows = windows_of(groups, *assignments[runner]);
  return out;
}

}  // namespace headwise::calib::noise

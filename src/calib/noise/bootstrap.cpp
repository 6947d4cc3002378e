#include "calib/noise/bootstrap.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "headwise/core/error.hpp"

namespace headwise::calib::noise {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

double pooled_mean(const SequenceValues& values) {
  return weighted_mean(values, std::vector<uint32_t>(values.sums.size(), 1));
}

double weighted_mean(const SequenceValues& values, const std::vector<uint32_t>& weights) {
  HEADWISE_CHECK(
      values.sums.size() == values.answers.size() && weights.size() == values.sums.size(),
      "bootstrap: {} sums, {} answer counts, {} weights", values.sums.size(), values.answers.size(),
      weights.size());
  double sum = 0.0;
  int64_t answers = 0;
  for (size_t s = 0; s < weights.size(); ++s) {
    if (weights[s] == 0) continue;
    sum += static_cast<double>(weights[s]) * values.sums[s];
    answers += static_cast<int64_t>(weights[s]) * values.answers[s];
  }
  return answers == 0 ? kNaN : sum / static_cast<double>(answers);
}

std::vector<std::vector<uint32_t>> bootstrap_weights(size_t sequences, size_t replicates,
                                                     uint64_t seed) {
  std::vector<std::vector<uint32_t>> out(replicates, std::vector<uint32_t>(sequences, 0));
  uint64_t state = seed;
  for (auto& weights : out) {
    for (size_t i = 0; i < sequences; ++i) {
      const auto product = static_cast<unsigned __int128>(splitmix64(state)) *
                           static_cast<unsigned __int128>(sequences);
      ++weights[static_cast<size_t>(product >> 64)];
    }
  }
  return out;
}

double sample_variance(const std::vector<double>& samples) {
  if (samples.size() < 2) return kNaN;
  double mean = 0.0, squares = 0.0;
  for (double v : samples) mean += v;
  mean /= static_cast<double>(samples.size());
  for (double v : samples) squares += (v - mean) * (v - mean);
  return squares / static_cast<double>(samples.size() - 1);
}

double quantile(std::vector<double> samples, double q) {
  std::erase_if(samples, [](double x) { return std::isnan(x); });
  if (samples.empty()) return kNaN;
  std::sort(samples.begin(), samples.end());
  const double h = (static_cast<double>(samples.size()) - 1.0) * std::clamp(q, 0.0, 1.0);
  const auto lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, samples.size() - 1);
  return samples[lo] + (h - static_cast<double>(lo)) * (samples[hi] - samples[lo]);
}

uint64_t decision_seed(const std::vector<std::vector<int64_t>>& sequences, int64_t layer_id) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  const auto mix = [&hash](uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) {
      hash ^= (value >> (8 * byte)) & 0xffU;
      hash *= 0x100000001b3ULL;
    }
  };
  mix(sequences.size());
  for (const auto& sequence : sequences) {
    mix(sequence.size());
    for (int64_t token : sequence) mix(static_cast<uint64_t>(token));
  }
  uint64_t state = hash ^ static_cast<uint64_t>(layer_id);
  return splitmix64(state);
}

std::vector<double> replicate_means(const std::vector<const SequenceValues*>& values,
                                    const std::vector<uint32_t>& weights) {
  std::vector<double> out;
  out.reserve(values.size());
  for (const SequenceValues* v : values) out.push_back(weighted_mean(*v, weights));
  return out;
}

}  // namespace headwise::calib::noise

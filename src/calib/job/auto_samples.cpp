#include "calib/job/auto_samples.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace headwise::calib {

bool wants_more_samples(const DecisionNoise& noise, int64_t cap) {
  return !noise.separated && std::isfinite(noise.sequences_to_separate) &&
         noise.sequences_to_separate <= static_cast<double>(cap);
}

std::optional<int64_t> next_samples(const std::vector<DecisionNoise>& noise, int64_t samples,
                                    int64_t cap) {
  if (samples >= cap) return std::nullopt;
  double need = 0.0;
  bool wanted = false;
  for (const DecisionNoise& layer : noise) {
    if (!wants_more_samples(layer, cap)) continue;
    wanted = true;
    need = std::max(need, layer.sequences_to_separate);
  }
  if (!wanted) return std::nullopt;
  const int64_t rounded = (static_cast<int64_t>(std::ceil(need)) + 7) / 8 * 8;
  return std::min(cap, std::max(2 * samples, rounded));
}

std::string unseparated_summary(const std::vector<DecisionNoise>& noise) {
  std::vector<std::string> parts;
  for (const DecisionNoise& layer : noise) {
    if (layer.separated) continue;
    parts.push_back(std::isfinite(layer.sequences_to_separate)
                        ? fmt::format("layer {} needs {:.0f}", layer.layer_id,
                                      std::ceil(layer.sequences_to_separate))
                        : fmt::format("layer {} (gap not positive)", layer.layer_id));
  }
  return parts.empty() ? "every decision separated" : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace headwise::calib

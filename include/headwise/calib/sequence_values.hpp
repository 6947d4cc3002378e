#pragma once
// One candidate's answer divergence per calibration sequence (issue 59): what a bootstrap over the
// sequences resamples (src/calib/noise/). The answer measures' value of a candidate is the pooled
// mean Σ_s sums[s] / Σ_s answers[s].
#include <cstdint>
#include <vector>

namespace headwise::calib {

struct SequenceValues {
  std::vector<double> sums;      // the divergence summed over sequence s's answer positions
  std::vector<int64_t> answers;  // how many answer positions sequence s has
};

}  // namespace headwise::calib

// The measures' table (measure_traits.hpp).
#include "headwise/calib/measure_traits.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "headwise/core/error.hpp"

namespace headwise::calib {
namespace {

using enum DistortionMeasure;
constexpr auto kTv = AnswerDivergence::kTv;
constexpr auto kKl = AnswerDivergence::kKl;

// name, provenance, scores answers, on the span, validates, gradients, divergence
const std::vector<MeasureTraits> kMeasures = {
    {kAnswerTvSpan, "answer-tv-span", "answer-tv-span", true, true, true, false, kTv},
    {kAnswerKlSpan, "answer-kl-span", "answer-kl-span", true, true, true, false, kKl},
    {kAnswerTv, "answer-tv", "answer-tv", true, false, false, false, kTv},
    {kAnswerKl, "answer-kl", "answer-kl", true, false, false, false, kKl},
    {kAnswerGrad, "answer-grad", "answer-grad", true, false, true, true, kKl},
    {kBlockMse, "block-mse", "block_output_relative_mse", false, false, false, false, kKl},
};

}  // namespace

const std::vector<MeasureTraits>& all_measure_traits() {
  return kMeasures;
}

const MeasureTraits& measure_traits(DistortionMeasure measure) {
  const auto it = std::find_if(kMeasures.begin(), kMeasures.end(),
                               [measure](const MeasureTraits& t) { return t.measure == measure; });
  HEADWISE_CHECK(it != kMeasures.end(), "distortion measure {} has no traits",
                 static_cast<int>(measure));
  return *it;
}

DistortionMeasure parse_distortion_measure(const std::string& text) {
  std::vector<std::string> names;
  for (const MeasureTraits& t : kMeasures) {
    if (text == t.name) return t.measure;
    names.emplace_back(t.name);
  }
  throw_field_error("distortion", ": '{}' is not one of {}", text, fmt::join(names, ", "));
}

const char* distortion_measure_name(DistortionMeasure measure) {
  return measure_traits(measure).name;
}

AnswerDivergence answer_divergence(DistortionMeasure m) {
  return measure_traits(m).divergence;
}

}  // namespace headwise::calib

#pragma once
// What each distortion measure (`--distortion`) is, in one table: its name, the divergence it
// scores, and what it needs from the job that runs it. Callers ask the measure for a property
// ("does it score answers?", "does it need the answer span's reference?") instead of testing which
// measure they hold, so that a new measure is one more row here and one more file under
// src/calib/measures/, not one more branch at every call.
#include <string>
#include <string_view>
#include <vector>

#include "headwise/calib/answer_reference.hpp"

namespace headwise::calib {

struct MeasureTraits {
  DistortionMeasure measure;
  const char* name;  // as --distortion spells it
  // The policy's calibration.distortion_measure (block-mse keeps its historical long name).
  const char* provenance_name;
  bool scores_answers;   // needs answer positions; keep rules and the unconditioned ablation use it
  bool runs_on_span;     // needs the answer span's reference forward (answer_span.hpp)
  bool can_validate;     // --validate-measure compares it with the exact measure
  bool needs_gradients;  // back-propagates through the layers above (no inference tensors)
  AnswerDivergence divergence;  // what the answer measures average (KL for block-mse: unused)
};

// The row of `measure`.
const MeasureTraits& measure_traits(DistortionMeasure measure);
// Every row, in the order --help lists them.
const std::vector<MeasureTraits>& all_measure_traits();

}  // namespace headwise::calib

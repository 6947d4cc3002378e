#pragma once
// The policy a calibration writes (calibration_job.cpp's last step): the walk's windows with the
// keep rules' windows and rules where they ran, the memory and engine bytes, and the provenance
// (policy.calibration: the recorded options, the data, the inputs hash, and under --decisions
// stable how sure each decision is).
#include <optional>

#include "calib/job/job_state.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::calib {

// Checks that the policy's counted bytes (the engine's where it has one) stay within the budget.
policy::Policy assemble_policy(const CalibrationJob::State& s, const SeqCalibResult& result,
                               const std::optional<KeepRuleResult>& rules, const AnswerSpan* span);

}  // namespace headwise::calib

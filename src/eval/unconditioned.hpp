#pragma once
// The `unconditioned` ablation (methods.cpp builds it): the policy's calibration with only the
// conditioning removed, calibrated inside eval when no --unconditioned-policy is given.
#include <cstdint>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_reference.hpp"
#include "headwise/eval/eval.hpp"

namespace headwise::eval {

// The measure the policy was calibrated with, as its provenance records it.
calib::DistortionMeasure calibrated_measure(const policy::Policy& policy);

// SeqCalib without conditioning on `calibration` (prompt + answer, cut from the front to the
// shortest: the end holds the query and its answer), with the policy's measure, ladder and sinks,
// within `budget` bytes of global KV.
memory::HeadWindows calibrate_unconditioned(arch::DecoderModel& model, const BaselineInputs& in,
                                            const std::vector<EvalSample>& calibration,
                                            int64_t budget);

}  // namespace headwise::eval

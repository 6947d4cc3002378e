#pragma once
// The probe pass: every global layer's curves measured with full KV below. They price the layers
// the walk has not reached yet (and, unconditioned, decide them).
#include "seqcalib_run.hpp"

namespace headwise::calib::seqcalib {

// Measures the probe curves (state.probe_groups, result.probe_curves) and the lambda at which they
// fit the budget.
void probe(const RunInputs& in, const AnswerMeasures& measures, RunState& state);

}  // namespace headwise::calib::seqcalib

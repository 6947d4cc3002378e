#pragma once
// The conditioned walk: every layer in execution order over the calibration stream, each global
// layer decided on the stream the layers below produce under their chosen windows, then run under
// its own; and resuming it from a checkpoint.
#include "headwise/calib/walk_state.hpp"
#include "seqcalib_run.hpp"

namespace headwise::calib::seqcalib {

// Resume: the probe and the decisions up to state.last_layer come from the checkpoint.
void restore(const WalkState& saved, RunState& state);

// Layer i over `h` through `core`, its output checked finite (the layer named when it is not).
at::Tensor run_checked(const RunInputs& in, int64_t i, const at::Tensor& h,
                       arch::AttentionCore& core);

// Walks every layer; the layers up to state.decisions.replay_until are replayed under their
// recorded windows, not decided again.
void walk(const RunInputs& in, const AnswerMeasures& measures, RunState& state);

}  // namespace headwise::calib::seqcalib

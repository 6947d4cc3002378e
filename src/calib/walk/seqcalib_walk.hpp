#pragma once
// The conditioned walk: every layer in execution order over the calibration stream, each global
// layer decided by the measure on the stream the layers below produce under their decisions, then
// run under its own; and resuming it from a checkpoint.
#include "calib/walk/seqcalib_run.hpp"
#include "headwise/calib/resume_checkpoint.hpp"

namespace headwise::calib::seqcalib {

class Measure;

// Resume: the probe and the decisions up to state.last_layer come from the checkpoint.
void restore(const ResumeCheckpoint& saved, RunState& state);

// Layer i over `h` through `core`, its output checked finite (the layer named when it is not).
at::Tensor run_checked(const RunInputs& in, int64_t i, const at::Tensor& h,
                       arch::AttentionCore& core);

// The first walk writes the resume checkpoint after each global layer; a re-walk does not (a
// resumed run redoes it from the first walk's state).
enum class WalkPass { kFirst, kRewalk };

// Walks every layer; the layers up to state.decisions.replay_until are replayed under their
// recorded windows, not decided again. The decisions go to state.decisions (and the layers'
// reports to the result); result.divergence_walk is the measure's value of the walk's final stream.
void walk(const RunInputs& in, Measure& measure, RunState& state, WalkPass pass);

}  // namespace headwise::calib::seqcalib

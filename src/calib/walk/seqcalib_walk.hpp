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

// What a walk decided and measured: every global layer's decision (those it replayed first),
// every layer's report (likewise), the measure's value of its final stream, and where its
// activations lived.
struct WalkRecord {
  Decisions decisions;
  std::vector<LayerReport> layers;
  double divergence = -1.0;
  std::string activations;
};

// Walks every layer; the layers up to state.decisions.replay_until are replayed under their
// recorded windows (their decisions and reports carried into the record), not decided again.
// Reads the probe and the decisions it replays from `state`, and changes nothing in it but the
// stream checkpoints and what the measure records of its own work; the caller adopts the record.
WalkRecord walk(const RunInputs& in, Measure& measure, RunState& state, WalkPass pass);

// Makes `walked` the run's decisions (state.decisions) and its record of the walk (state.walk).
void adopt(RunState& state, WalkRecord walked);

}  // namespace headwise::calib::seqcalib

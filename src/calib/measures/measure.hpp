#pragma once
// A distortion measure as SeqCalib drives it: one object with a lifecycle, in the order the run
// calls it (seqcalib.cpp):
//   made      the measure's own preparation (the answer measures' full-KV reference forward);
//   probe     every global layer's curves with full KV below (they price the layers not yet
//             walked, and decide them all without conditioning);
//   decide    each global layer in the walk, on the stream the layers below produce under their
//             decisions, run under its own decision so that the stream leaves the layer;
//   walked    the walk's end-to-end value, read off its final stream;
//   refine    what it does after the exact completion (re-walks, the cross-layer re-solve).
// Block-mse, the exact answer measures (answer-kl/-tv), answer-grad and the answer span are its
// implementations, one file each; the walk, the probe and the completion never ask which one
// they hold. What each measure needs from the job is in its traits (measure_traits.hpp).
#include <cstdint>
#include <memory>
#include <vector>

#include "calib/walk/seqcalib_run.hpp"

namespace headwise::calib::seqcalib {

class Measure {
 public:
  virtual ~Measure() = default;

  // The sequences the probe measures (for its log line).
  virtual int64_t probe_samples(const RunInputs& in, const RunState& state) const {
    return in.probe_samples();
  }
  // Fills state.probe_groups.
  virtual void probe(const RunInputs& in, RunState& state) = 0;

  // Decides global layer `layer` on `stream` (the stream entering it), after the layers the walk
  // decided so far (`walked`), and runs the layer under the decision: `stream` leaves the layer.
  // Returns the decision; the walk records it.
  virtual LayerDecision decide_and_run(const RunInputs& in, RunState& state,
                                       const Decisions& walked, int64_t layer,
                                       ActivationStream& stream, LayerReport& report) = 0;

  // The walk's end-to-end answer divergence, read off the stream that has passed every layer
  // under the walk's windows; -1 for a measure that scores no answers.
  virtual double value_of_walk(ActivationStream& final_stream) { return -1.0; }

  // The passes after the walk's exact completion that the measure calls for.
  virtual void refine_after_completion(const RunInputs& in, RunState& state) {}
};

// Makes a measure, prepared (its reference forward run); opens state.validation when the run
// validates it.
using MeasureMaker = std::unique_ptr<Measure> (*)(const RunInputs& in, RunState& state);

// Each measure's file registers its maker from a static initialiser, as the architectures do
// (`static RegisterMeasure r{DistortionMeasure::kX, &make};`): adding a measure touches no other
// file but its row in traits.cpp.
struct RegisterMeasure {
  RegisterMeasure(DistortionMeasure measure, MeasureMaker make);
};

// The measure of in.options.measure, made by its registered maker.
std::unique_ptr<Measure> make_measure(const RunInputs& in, RunState& state);

// The probe pass with `measure`: its curves, and the lambda at which they fit the budget
// (seqcalib_probe.cpp).
void probe(const RunInputs& in, Measure& measure, RunState& state);

// Runs global layer `layer` over `stream` under `windows` (the layer's decision).
void run_layer_at(const RunInputs& in, int64_t layer, const std::vector<int64_t>& windows,
                  ActivationStream& stream);

}  // namespace headwise::calib::seqcalib

#pragma once
// A layer's rate-distortion curves, as the SeqCalib units build them: per head from block-mse
// sums, or from a measure of the layer's joint windows (each head moved against the others at a
// given assignment), and the assignments those measures are asked for.
#include <cstdint>
#include <functional>
#include <vector>

#include "calib/walk/joint_descent.hpp"
#include "calib/walk/seqcalib_run.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_reference.hpp"

namespace headwise::calib::seqcalib {

// A measure of one layer's joint windows, and its prefetch: told every assignment a step names,
// a batched measure runs them all at once (empty when it does not batch).
struct LayerMeasure {
  JointMeasure measure;
  JointPrefetch prefetch;
};

// Every head's curve of `layer` from its block-mse sums.
std::vector<solve::Group> layer_groups(const arch::LayerSpec& layer,
                                       const measure::DistortionAccumulator& acc,
                                       const SeqCalibOptions& options);

std::vector<HeadCurve> to_curves(const std::vector<solve::Group>& groups);

MeasureCheck measure_check(int64_t layer, int64_t head, std::vector<int64_t> windows,
                           double predicted, double measured);

// Every head's curve against the other heads at `at`: d(h, l) = E(at, head h at l) -
// E(at, head h at the top level), E the measured answer KL of the layer's joint windows.
std::vector<solve::Group> marginal_groups(const RunInputs& in, int64_t layer_id,
                                          const std::vector<size_t>& at, const JointMeasure& joint,
                                          const JointPrefetch& prefetch = {});

// Every joint assignment of a layer of `heads` KV heads when there are at most
// kEnumeratedAssignments of them (the descent then prices from one batch); else none.
inline constexpr size_t kEnumeratedAssignments = 64;
std::vector<std::vector<size_t>> every_assignment(const RunInputs& in, size_t heads);

// Every assignment marginal_groups(at) prices: each head at each level, the others at `at`.
std::vector<std::vector<size_t>> marginal_assignments(const RunInputs& in,
                                                      const std::vector<size_t>& at);

// `all` without repeats, in first-seen order.
std::vector<std::vector<size_t>> unique_assignments(std::vector<std::vector<size_t>> all);

// A memoised measure of one layer's joint windows on the stream entering it.
JointMeasure joint_measure(const RunInputs& in, AnswerReference& measure, int64_t layer_id,
                           ActivationStream& stream, LevelMemo& memo);

// The probe's curves of one layer: every head against the others at the top level, on `measure`
// of the layer's joint windows.
std::vector<solve::Group> answer_probe_groups(const RunInputs& in, int64_t layer_id,
                                              const JointMeasure& measure);

// The joint measure plus, for each head at a level the sequences cannot measure, that level's
// extrapolated cost on the head's curve (`curves`, with the other heads at the top level):
// measured, such a level reads as free, and a descent would take it first.
JointMeasure with_extrapolated_levels(const SeqCalibOptions& options, JointMeasure measured,
                                      const std::vector<solve::Group>& curves);

}  // namespace headwise::calib::seqcalib

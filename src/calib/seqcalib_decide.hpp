#pragma once
// One global layer's decision in the walk: the Lagrangian controller that gives the layer its
// bytes (price_layer), the choice within them (from block-mse curves, or jointly over the layer's
// heads for the answer measures), and its record in the run's decisions.
#include <cstdint>
#include <vector>

#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_span.hpp"
#include "seqcalib_run.hpp"

namespace headwise::calib::seqcalib {

// The ablation baseline: one exact solve over curves measured with full KV below.
void plan_unconditioned(const RunInputs& in, RunState& state);

// Chooses layer `layer_id`'s windows from its block-mse sums: argmin d + lambda*r with the
// smallest lambda at which this layer plus the probe plan of the layers above fits what is left.
std::vector<int64_t> decide(const RunInputs& in, RunState& state, int64_t layer_id,
                            const measure::DistortionAccumulator& local, LayerReport& report);

// The answer measures' decision of a layer's heads together, on the stream entering it; `given`:
// the span measure's site of the layer when its own pass captured it.
std::vector<int64_t> decide_jointly(const RunInputs& in, const AnswerMeasures& measures,
                                    RunState& state, int64_t layer_id, ActivationStream& stream,
                                    LayerReport& report, const SpanSite* given = nullptr);

}  // namespace headwise::calib::seqcalib

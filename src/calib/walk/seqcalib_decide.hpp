#pragma once
// One global layer's decision in the walk, as every measure takes it: the Lagrangian controller
// that gives the layer its bytes (price_layer), the record of the decision in the run's decisions,
// and the joint decision of a layer's heads on a measure of their joint windows (the answer
// measures'; each measure supplies the measure and its hooks).
#include <cstdint>
#include <functional>
#include <vector>

#include "calib/walk/joint_descent.hpp"
#include "calib/walk/seqcalib_curves.hpp"
#include "calib/walk/seqcalib_run.hpp"
#include "headwise/calib/sequence_values.hpp"

namespace headwise::calib::seqcalib {

// The ablation baseline: one exact solve over curves measured with full KV below.
void plan_unconditioned(const RunInputs& in, RunState& state);

// The controller: the smallest lambda at which this layer's curves plus the probe plan of the
// layers above fit what is left of the budget after the layers `walked` decided
// (report.lambda), the bytes that plan keeps for the layers above (report.planned_ahead);
// returns what this layer may spend.
int64_t price_layer(const RunInputs& in, const RunState& state, const Decisions& walked,
                    int64_t layer_id, const std::vector<solve::Group>& groups, LayerReport& report);

// A layer's decision (its curves and choice, the windows and bytes they give), its bytes in the
// report; checks that it stays within what the controller gave it after `walked`.
LayerDecision layer_decision(const RunInputs& in, const Decisions& walked,
                             const std::vector<solve::Group>& groups,
                             const std::vector<size_t>& choice, LayerReport& report);

// Without conditioning: the probe plan's choice for the layer.
LayerDecision unconditioned_decision(const RunInputs& in, const RunState& state,
                                     const Decisions& walked, int64_t layer_id,
                                     LayerReport& report);

// What a measure gives the joint decision of one layer. `measure` is called once the decision
// needs values (never without conditioning), with the memo its values go into; `seed` first puts
// in the values known before the decision (they are not counted as its evaluations).
struct JointLayerSource {
  std::function<void(LevelMemo& memo)> seed;
  std::function<LayerMeasure(LevelMemo& memo)> measure;
  // answer-grad: improves the descent's assignment within the allowance (re-linearised).
  std::function<void(const std::vector<solve::Group>& groups, int64_t allowance,
                     std::vector<size_t>& assign, const JointMeasure& joint)>
      improve;
  // Validation against the exact measure: the chosen assignment, the joint measure it was chosen
  // on, the curves, the allowance and the price.
  std::function<void(const std::vector<size_t>& assign, const JointMeasure& joint,
                     const std::vector<solve::Group>& groups, int64_t allowance, double price)>
      validate;
  // The per-sequence values of an assignment the measure measured (nullptr: none kept): with them
  // the decision states how sure it is (LayerDecision::noise, a bootstrap over the sequences).
  std::function<const SequenceValues*(const std::vector<size_t>& levels)> per_sequence;
};

// The answer measures' decision of a layer's heads together, on the measure `source` gives,
// after the layers `walked` decided.
LayerDecision decide_jointly(const RunInputs& in, RunState& state, const Decisions& walked,
                             int64_t layer_id, const JointLayerSource& source, LayerReport& report);

}  // namespace headwise::calib::seqcalib

#pragma once
// The whole-model answer measures: answer-kl / answer-tv (exact: every layer above run over every
// token per candidate, exact_answer_measure.cpp) and answer-grad (the same predicted from
// gradients, gradient_measure.cpp). They share the reference forward (calib::AnswerReference), the
// probe loop, the joint decision of a layer's heads and what follows the completion: measure what
// it did end to end, re-walk above a lower layer it moved, and re-solve across layers.
#include <functional>
#include <memory>

#include "calib/measures/measure.hpp"
#include "calib/walk/seqcalib_decide.hpp"
#include "headwise/calib/answer_reference.hpp"

namespace headwise::calib::seqcalib {

class AnswerMeasure : public Measure {
 public:
  // Runs the full-KV reference at the answer positions of this rank's sequences.
  explicit AnswerMeasure(const RunInputs& in);

  void probe(const RunInputs& in, RunState& state) override;
  LayerDecision decide_and_run(const RunInputs& in, RunState& state, const Decisions& walked,
                               int64_t layer, ActivationStream& stream,
                               LayerReport& report) override;
  double value_of_walk(ActivationStream& final_stream) override;
  void refine_after_completion(const RunInputs& in, RunState& state) override;

 protected:
  // One probed layer's curves on the stream entering it (full KV below), measured on `prefix`
  // (the reference on the probe's sequences).
  using LayerProbe =
      std::function<std::vector<solve::Group>(int64_t layer, ActivationStream& stream)>;
  virtual LayerProbe layer_probe(const RunInputs& in, AnswerReference& prefix, RunState& state);
  // The source of one layer's joint decision on the conditioned stream.
  virtual JointLayerSource joint_source(const RunInputs& in, RunState& state, int64_t layer,
                                        ActivationStream& stream);

  AnswerReference& exact() { return *exact_; }

 private:
  std::unique_ptr<AnswerReference> exact_;
};

}  // namespace headwise::calib::seqcalib

// answer-grad: the answer measure predicted from gradients of the answers' log-odds
// (calib::AnswerSensitivity) instead of one run of the layers above per candidate; with
// --validate-measure, every probe (head, level) pair and every joint decision is also measured
// exactly and reported beside the prediction.
#include <optional>

#include "calib/measures/answer_measure.hpp"
#include "calib/walk/seqcalib_curves.hpp"
#include "calib/walk/seqcalib_validation.hpp"
#include "headwise/calib/answer_grad.hpp"

namespace headwise::calib::seqcalib {
namespace {

// The prediction is a linearisation at full KV, blind to heads whose redundancy saturates
// (cutting one of two changes nothing to first order, cutting both is predicted free as well).
// Re-linearise at the decision and take the moves the new prediction says help, until none does
// or kRelinearisations passes.
constexpr int kRelinearisations = 3;

class GradientMeasure final : public AnswerMeasure {
 public:
  GradientMeasure(const RunInputs& in, RunState& state)
      : AnswerMeasure(in),
        sensitivity_(in.model, exact(), in.options.ladder.levels, in.options.sink_tokens) {
    if (in.options.validate_measure) state.validation.emplace();
  }

  void probe(const RunInputs& in, RunState& state) override {
    AnswerMeasure::probe(in, state);
    probe_sensitivity_.reset();  // its gradients were the probe's alone
  }

 protected:
  LayerProbe layer_probe(const RunInputs& in, AnswerReference& prefix, RunState& state) override {
    probe_sensitivity_.emplace(in.model, prefix, in.options.ladder.levels, in.options.sink_tokens);
    return [this, &in, &prefix, &state](int64_t layer, ActivationStream& stream) {
      AnswerSensitivity& sensitivity = *probe_sensitivity_;
      sensitivity.prepare(layer, stream);
      std::vector<solve::Group> groups = answer_probe_groups(
          in, layer,
          [&sensitivity](const std::vector<size_t>& l) { return sensitivity.predict(l); });
      if (state.validation)
        validate_probe_pairs(in, prefix, layer, stream, groups, *state.validation);
      return groups;
    };
  }

  JointLayerSource joint_source(const RunInputs& in, RunState& state, int64_t layer,
                                ActivationStream& stream) override {
    JointLayerSource source;
    source.measure = [this, layer, &stream](LevelMemo&) {
      sensitivity_.prepare(layer, stream);
      return LayerMeasure{
          [this](const std::vector<size_t>& levels) { return sensitivity_.predict(levels); }, {}};
    };
    source.improve = [this, &in, layer, &stream](const std::vector<solve::Group>& groups,
                                                 int64_t allowance, std::vector<size_t>& assign,
                                                 const JointMeasure& joint) {
      for (int pass = 0; pass < kRelinearisations; ++pass) {
        sensitivity_.prepare(layer, stream, in.windows_of(assign));
        bool improved = false;
        while (best_swap(groups, assign, allowance, joint)) improved = true;
        if (!improved) break;
      }
    };
    if (state.validation) {
      source.validate = [this, &in, &state, layer, &stream](const std::vector<size_t>& assign,
                                                            const JointMeasure& joint,
                                                            const std::vector<solve::Group>& groups,
                                                            int64_t allowance, double price) {
        validate_joint_decision(in, exact(), layer, stream, assign, joint, groups, allowance, price,
                                /*with_own_decision=*/false, state);
      };
    }
    return source;
  }

 private:
  AnswerSensitivity sensitivity_;
  std::optional<AnswerSensitivity> probe_sensitivity_;  // on the probe's sequences
};

std::unique_ptr<Measure> make(const RunInputs& in, RunState& state) {
  return std::make_unique<GradientMeasure>(in, state);
}

}  // namespace

static RegisterMeasure answer_grad_registration{DistortionMeasure::kAnswerGrad, &make};

}  // namespace headwise::calib::seqcalib

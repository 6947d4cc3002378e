// answer-kl / answer-tv: the exact answer measures (AnswerMeasure as it is), and the parts every
// whole-model answer measure shares.
#include <spdlog/spdlog.h>

#include "calib/measures/answer_measure.hpp"
#include "calib/walk/seqcalib_completion.hpp"
#include "calib/walk/seqcalib_curves.hpp"
#include "calib/walk/seqcalib_walk.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/progress.hpp"

namespace headwise::calib::seqcalib {

AnswerMeasure::AnswerMeasure(const RunInputs& in) {
  spdlog::info("{}: full-KV reference at the answer positions ({} sequences)",
               measure_traits(in.options.measure).name, in.local_sequences.size());
  exact_ = std::make_unique<AnswerReference>(
      in.model, in.local_sequences, in.local_answers, in.options.micro_batch,
      in.options.sink_tokens, in.world, measure_traits(in.options.measure).divergence);
}

void AnswerMeasure::probe(const RunInputs& in, RunState& state) {
  const std::vector<std::vector<int64_t>> sequences = in.local_prefix(in.probe_samples());
  ActivationStream stream(in.model, sequences, in.options.micro_batch, in.options.activations);
  AnswerReference prefix = exact_->prefix(static_cast<int64_t>(sequences.size()));
  const LayerProbe probe_layer = layer_probe(in, prefix, state);
  arch::ExactAttentionCore exact_core(in.model.attention_chunk());
  Progress progress(fmt::format("probe (full KV, {})", measure_traits(in.options.measure).name),
                    in.spec.num_layers());
  for (int64_t i = 0; i < in.spec.num_layers(); ++i) {
    if (in.spec.layer(i).is_global()) {
      state.probe_groups[i] = probe_layer(i, stream);
    }
    stream.apply([&](const at::Tensor& h) { return run_checked(in, i, h, exact_core); });
    in.model.release_layer(i);
    progress.update(i + 1, fmt::format("layer {} {}", i, layer_kind_name(in.spec.layer(i).kind)));
  }
  progress.finish();
  state.answer_evaluations += prefix.evaluations();
}

AnswerMeasure::LayerProbe AnswerMeasure::layer_probe(const RunInputs& in, AnswerReference& prefix,
                                                     RunState&) {
  return [&in, &prefix](int64_t layer, ActivationStream& stream) {
    LevelMemo memo;
    return answer_probe_groups(in, layer, joint_measure(in, prefix, layer, stream, memo));
  };
}

JointLayerSource AnswerMeasure::joint_source(const RunInputs& in, RunState&, int64_t layer,
                                             ActivationStream& stream) {
  JointLayerSource source;
  source.measure = [this, &in, layer, &stream](LevelMemo& memo) {
    return LayerMeasure{joint_measure(in, *exact_, layer, stream, memo), {}};
  };
  return source;
}

LayerDecision AnswerMeasure::decide_and_run(const RunInputs& in, RunState& state,
                                            const Decisions& walked, int64_t layer,
                                            ActivationStream& stream, LayerReport& report) {
  LayerDecision decision =
      decide_jointly(in, state, walked, layer, joint_source(in, state, layer, stream), report);
  run_layer_at(in, layer, decision.windows, stream);
  return decision;
}

double AnswerMeasure::value_of_walk(ActivationStream& final_stream) {
  return exact_->evaluate_final(final_stream);
}

// The completion may lengthen windows of layers whose upper layers were decided on the walk's
// stream: what that does end to end is measured, then fresh conditioning and the re-solve.
void AnswerMeasure::refine_after_completion(const RunInputs& in, RunState& state) {
  const PolicyValue value = [this, &in](const Windows& windows) {
    ActivationStream embedded(in.model, in.local_sequences, in.options.micro_batch,
                              in.options.activations);
    return exact_->evaluate_policy(embedded, windows);
  };
  measure_completion_effect(in, value, state);
  if (!in.options.conditioned) return;
  rewalk_while_completion_moves_lower_layers(in, *this, value, state);
  resolve_across_layers(in, *this, value, state);
}

namespace {

std::unique_ptr<Measure> make(const RunInputs& in, RunState&) {
  return std::make_unique<AnswerMeasure>(in);
}

}  // namespace

static RegisterMeasure answer_kl_registration{DistortionMeasure::kAnswerKl, &make};
static RegisterMeasure answer_tv_registration{DistortionMeasure::kAnswerTv, &make};

}  // namespace headwise::calib::seqcalib

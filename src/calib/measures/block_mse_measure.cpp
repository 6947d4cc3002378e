// block-mse: a head's distortion at a window is the attention block's output error over every
// position (mean_t ||Wo_h (a_w - a_full)||^2 / mean_t ||y_full||^2), all levels in one pass of
// the multi-window attention. Heads are priced apart; the layer is chosen by the controller's
// lambda. It scores no answers: no reference forward, nothing to refine after the completion.
#include "calib/measures/measure.hpp"
#include "calib/walk/seqcalib_cores.hpp"
#include "calib/walk/seqcalib_curves.hpp"
#include "calib/walk/seqcalib_decide.hpp"
#include "calib/walk/seqcalib_walk.hpp"
#include "calib/walk/shard_constraint.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/progress.hpp"

namespace headwise::calib::seqcalib {
namespace {

class BlockMseMeasure final : public Measure {
 public:
  void probe(const RunInputs& in, RunState& state) override {
    const std::vector<std::vector<int64_t>> sequences = in.local_prefix(in.probe_samples());
    ActivationStream stream(in.model, sequences, in.options.micro_batch, in.options.activations);
    Accumulators accumulators;
    MeasuringCore core(in.options, in.model.attention_chunk(), accumulators, nullptr);
    Progress progress("probe (full KV)", in.spec.num_layers());
    for (int64_t i = 0; i < in.spec.num_layers(); ++i) {
      in.model.prefetch_layer(i + 1);  // loads while layer i computes
      stream.apply([&](const at::Tensor& h) {
        at::Tensor out = in.model.run_layer(i, h, {&core, nullptr, 0});
        // A global layer's NaN is reported by head (its distortions) before the hidden check.
        if (const auto it = accumulators.find(i); it != accumulators.end())
          it->second.check_finite(i);
        return checked_finite(std::move(out), i, in.spec.layer(i).kind);
      });
      in.model.release_layer(i);
      progress.update(i + 1, fmt::format("layer {} {}", i, layer_kind_name(in.spec.layer(i).kind)));
    }
    progress.finish();
    for (const int64_t layer_id : in.spec.global_layer_ids()) {
      // A rank without probe sequences measured nothing: it contributes empty sums.
      const auto [local, inserted] =
          accumulators.try_emplace(layer_id, in.spec.layer(layer_id).attention->num_kv_heads,
                                   static_cast<int64_t>(in.options.ladder.size()));
      const measure::DistortionAccumulator acc = in.merged_over_ranks(layer_id, local->second);
      acc.check_finite(layer_id);
      state.probe_groups[layer_id] = layer_groups(in.spec.layer(layer_id), acc, in.options);
    }
  }

  // One micro-batch: the layer is measured, decided and run under its decision in one pass.
  // Several: all of them measured, then decided, then propagated under the decision.
  LayerDecision decide_and_run(const RunInputs& in, RunState& state, const Decisions& walked,
                               int64_t layer, ActivationStream& stream,
                               LayerReport& report) override {
    Accumulators accumulators;
    LayerDecision decision;
    if (stream.micro_batches() == 1) {
      MeasuringCore core(
          in.options, in.model.attention_chunk(), accumulators, [&](int64_t layer_id) {
            decision = decide(in, state, walked, layer_id, accumulators.at(layer_id), report);
            return decision.windows;
          });
      stream.apply([&](const at::Tensor& h) { return run_checked(in, layer, h, core); });
      return decision;
    }
    MeasuringCore core(in.options, in.model.attention_chunk(), accumulators, nullptr);
    stream.visit([&](const at::Tensor& h) { in.model.run_layer(layer, h, {&core, nullptr, 0}); });
    decision = decide(in, state, walked, layer, accumulators.at(layer), report);
    run_layer_at(in, layer, decision.windows, stream);
    return decision;
  }

 private:
  // The layer's windows from its block-mse sums: argmin d + lambda*r with the smallest lambda at
  // which this layer plus the probe plan of the layers above fits what is left.
  static LayerDecision decide(const RunInputs& in, const RunState& state, const Decisions& walked,
                              int64_t layer_id, const measure::DistortionAccumulator& local,
                              LayerReport& report) {
    const measure::DistortionAccumulator acc = in.merged_over_ranks(layer_id, local);
    acc.check_finite(layer_id);
    if (!in.options.conditioned) {
      return unconditioned_decision(in, state, walked, layer_id, report);
    }
    const std::vector<solve::Group> groups = layer_groups(in.spec.layer(layer_id), acc, in.options);
    const int64_t allowance = price_layer(in, state, walked, layer_id, groups, report);
    const std::vector<size_t> choice =
        constrained_to_shards(in) ? shard_relaxed_choice(in, groups, allowance, report.lambda)
                                  : solve::relax_at(groups, report.lambda).choice;
    return layer_decision(in, walked, groups, choice, report);
  }
};

std::unique_ptr<Measure> make(const RunInputs&, RunState&) {
  return std::make_unique<BlockMseMeasure>();
}

}  // namespace

static RegisterMeasure block_mse_registration{DistortionMeasure::kBlockMse, &make};
}  // namespace headwise::calib::seqcalib

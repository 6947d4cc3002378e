#include "seqcalib_probe.hpp"

#include <spdlog/spdlog.h>

#include <optional>

#include "finite_checks.hpp"
#include "headwise/core/progress.hpp"
#include "seqcalib_cores.hpp"
#include "seqcalib_curves.hpp"
#include "seqcalib_span.hpp"
#include "seqcalib_validation.hpp"

namespace headwise::calib::seqcalib {
namespace {

void answer_probe(const RunInputs& in, const AnswerMeasures& measures, ActivationStream& stream,
                  const std::vector<std::vector<int64_t>>& probe_sequences, RunState& state) {
  AnswerKl measure = measures.answer_kl->prefix(static_cast<int64_t>(probe_sequences.size()));
  std::optional<AnswerSensitivity> sensitivity;
  if (in.gradient_measure())
    sensitivity.emplace(in.model, measure, in.options.ladder.levels, in.options.sink_tokens);
  arch::ExactAttentionCore exact(in.model.attention_chunk());
  Progress progress(fmt::format("probe (full KV, {})", distortion_measure_name(in.options.measure)),
                    in.spec.num_layers());
  for (int64_t i = 0; i < in.spec.num_layers(); ++i) {
    if (in.spec.layer(i).is_global()) {
      state.probe_groups[i] =
          answer_probe_groups(in, measure, sensitivity ? &*sensitivity : nullptr, i, stream);
      if (state.result.validation) {
        validate_probe_pairs(in, measure, i, stream, state.probe_groups[i],
                             *state.result.validation);
      }
      append(state.result.probe_curves, to_curves(state.probe_groups[i]));
    }
    stream.apply([&](const at::Tensor& h) {
      return checked_finite(in.model.run_layer(i, h, {&exact, nullptr, 0}), i,
                            in.spec.layer(i).kind);
    });
    in.model.release_layer(i);
    progress.update(i + 1, fmt::format("layer {} {}", i, layer_kind_name(in.spec.layer(i).kind)));
  }
  progress.finish();
  state.result.answer_kl_evaluations += measure.evaluations();
}

void block_mse_probe(const RunInputs& in, ActivationStream& stream, RunState& state) {
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
    append(state.result.probe_curves, to_curves(state.probe_groups[layer_id]));
  }
}

}  // namespace

void probe(const RunInputs& in, const AnswerMeasures& measures, RunState& state) {
  const auto start = Clock::now();
  const int64_t samples = in.span() ? span_probe_samples(in, state) : in.probe_samples();
  if (in.span()) {
    span_probe(in, measures, state);
  } else {
    const std::vector<std::vector<int64_t>> probe_sequences = in.local_prefix(samples);
    ActivationStream stream(in.model, probe_sequences, in.options.micro_batch,
                            in.options.activations);
    if (in.answer_aware()) {
      answer_probe(in, measures, stream, probe_sequences, state);
    } else {
      block_mse_probe(in, stream, state);
    }
  }
  std::vector<solve::Group> all;
  for (const auto& [id, groups] : state.probe_groups) append(all, groups);
  state.result.probe_lambda = solve::min_fitting_lambda(all, in.options.global_budget_bytes);
  state.result.probe_seconds = seconds_since(start);
  spdlog::info("probe: {} global layers measured on {} sequences in {:.1f}s, lambda {:.4g}",
               state.probe_groups.size(), samples, state.result.probe_seconds,
               state.result.probe_lambda);
}

}  // namespace headwise::calib::seqcalib

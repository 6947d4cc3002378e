// answer-tv-span / answer-kl-span (the default measure): a layer's candidates run on the answer
// span only, against caches of everything before it kept from one full-KV forward
// (answer_span.hpp), so a decision costs a few forwards at any depth. Its probe is one sweep over
// the reference pass's sites; a layer is decided inside its own pass when it can be; the
// cross-layer re-solve is checked on the answer span (or by a re-walk, --re-solve-by-rewalk). With
// --validate-measure the exact measure runs beside it and every probe pair and joint decision is
// reported against it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>

#include "calib/measures/measure.hpp"
#include "calib/noise/stable_choice.hpp"
#include "calib/walk/joint_descent.hpp"
#include "calib/walk/seqcalib_completion.hpp"
#include "calib/walk/seqcalib_cores.hpp"
#include "calib/walk/seqcalib_decide.hpp"
#include "calib/walk/seqcalib_validation.hpp"
#include "calib/walk/seqcalib_walk.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/measure_traits.hpp"

namespace headwise::calib::seqcalib {
namespace {

// Per assignment of one layer, its values per calibration sequence (issue 59: what the decision's
// bootstrap resamples).
using SequenceMemo = std::map<std::vector<size_t>, SequenceValues>;

// The answer-span measure of layer `site.layer`'s joint windows, memoised in `memo` (and each
// assignment's per-sequence values in `sequences`); its prefetch measures every assignment a step
// names in one batch.
LayerMeasure span_layer_measure(const RunInputs& in, AnswerSpan& span, const SpanSite& site,
                                LevelMemo& memo, SequenceMemo& sequences) {
  const auto run = [&in, &span, &site, &memo,
                    &sequences](const std::vector<std::vector<size_t>>& assignments) {
    std::vector<std::vector<size_t>> missing;
    std::vector<SpanOutputs> outputs;
    for (const auto& levels : assignments) {
      if (memo.contains(levels) ||
          std::find(missing.begin(), missing.end(), levels) != missing.end())
        continue;
      missing.push_back(levels);
      outputs.push_back(site.compose(in.windows_of(levels)));
    }
    if (missing.empty()) return;
    std::vector<SequenceValues> per_sequence;
    const auto values = span.evaluate(
        site, outputs, fmt::format("layer {}: {}", site.layer, in.measured_label()), &per_sequence);
    for (size_t c = 0; c < missing.size(); ++c) {
      memo.emplace(missing[c], values[c]);
      sequences.emplace(missing[c], std::move(per_sequence[c]));
    }
  };
  return {[run, &memo](const std::vector<size_t>& levels) {
            if (!memo.contains(levels)) run({levels});
            return memo.at(levels);
          },
          run};
}

// The layers above the lowest global one are probed on a share of the sequences (--probe-samples,
// half by default, as the other measures probe): their curves only price the bytes the walk
// keeps for them, and each is measured again on the conditioned stream when the walk reaches it.
// The lowest layer is probed on every sequence: the walk decides it from these very values. A run
// that validates its measure probes on every sequence, as the exact measure does.
int64_t span_probe_samples(const RunInputs& in, const RunState& state) {
  return state.validation ? static_cast<int64_t>(in.sequences.size()) : in.probe_samples();
}

// span_probe_samples as this rank's SweepItem::sequences (-1: every sequence).
int64_t span_probe_local_sequences(const RunInputs& in, const RunState& state) {
  const int64_t samples = span_probe_samples(in, state);
  if (samples >= static_cast<int64_t>(in.sequences.size())) return -1;
  return static_cast<int64_t>(in.local_prefix(samples).size());
}

// No forward of its own: every site comes from the reference pass.
// `sequences` receives the per-sequence values of the lowest global layer's assignments (measured
// on every sequence: the walk decides that layer from them).
void span_probe(const RunInputs& in, AnswerSpan& span, AnswerReference* exact, RunState& state,
                SequenceMemo& sequences) {
  std::vector<int64_t> layers = in.spec.global_layer_ids();
  const int64_t upper_sequences = span_probe_local_sequences(in, state);
  std::vector<AnswerSpan::SweepItem> items;
  std::vector<std::vector<std::vector<size_t>>> assignments;
  for (int64_t id : layers) {
    const auto heads = static_cast<size_t>(in.spec.layer(id).attention->num_kv_heads);
    const std::vector<size_t> top(heads, in.options.ladder.size() - 1);
    std::vector<std::vector<size_t>> wanted = marginal_assignments(in, top);
    // Nothing below the lowest global layer is cut: the walk measures it on this very stream, so
    // the sweep measures every assignment the walk may ask for (when there are few) once.
    if (id == layers.front()) append(wanted, every_assignment(in, heads));
    // Every head at full KV on the full-KV stream is the reference itself: divergence 0, no run.
    wanted.erase(std::remove(wanted.begin(), wanted.end(), top), wanted.end());
    assignments.push_back(unique_assignments(std::move(wanted)));
    const SpanSite& site = span.reference_site(id);
    AnswerSpan::SweepItem item{&site, {}};
    if (id != layers.front()) item.sequences = upper_sequences;
    for (const auto& levels : assignments.back())
      item.candidates.push_back(site.compose(in.windows_of(levels)));
    items.push_back(std::move(item));
  }
  std::vector<std::vector<SequenceValues>> per_sequence;
  const auto values =
      span.sweep(items, fmt::format("probe (full KV): {}", in.measured_label()), &per_sequence);
  in.model.release_all();
  for (size_t i = 0; i < layers.size(); ++i) {
    LevelMemo& memo = state.probe_memo[layers[i]];
    for (size_t c = 0; c < assignments[i].size(); ++c)
      memo.emplace(assignments[i][c], values[i][c]);
    if (i == 0 && !per_sequence[i].empty()) {
      for (size_t c = 0; c < assignments[i].size(); ++c)
        sequences.emplace(assignments[i][c], std::move(per_sequence[i][c]));
      // Every head at full KV on the full-KV stream: 0 on every sequence.
      SequenceValues reference = sequences.begin()->second;
      std::fill(reference.sums.begin(), reference.sums.end(), 0.0);
      sequences.emplace(
          std::vector<size_t>(static_cast<size_t>(in.spec.layer(layers[i]).attention->num_kv_heads),
                              in.options.ladder.size() - 1),
          std::move(reference));
    }
    const auto heads = static_cast<size_t>(in.spec.layer(layers[i]).attention->num_kv_heads);
    const std::vector<size_t> top(heads, in.options.ladder.size() - 1);
    memo.emplace(top, 0.0);
    state.probe_groups[layers[i]] = marginal_groups(
        in, layers[i], top, [&memo](const std::vector<size_t>& l) { return memo.at(l); });
  }
  state.answer_evaluations += span.evaluations();
  if (state.validation) {
    validate_span_probe(in, *exact, state.probe_groups, *state.validation);
  }
}

LayerMeasure span_decision_measure(const RunInputs& in, AnswerSpan& span, int64_t layer_id,
                                   ActivationStream& stream, bool on_reference_stream,
                                   const SpanSite* given, LevelMemo& memo, SequenceMemo& sequences,
                                   std::optional<SpanSite>& captured) {
  const SpanSite& site = on_reference_stream ? span.reference_site(layer_id)
                         : given             ? *given
                                             : captured.emplace(span.capture(layer_id, stream));
  LayerMeasure layer_cost = span_layer_measure(in, span, site, memo, sequences);
  // A small layer's every joint assignment in one batch: one run of the layers above.
  const std::vector<std::vector<size_t>> all =
      every_assignment(in, static_cast<size_t>(in.spec.layer(layer_id).attention->num_kv_heads));
  if (!all.empty()) layer_cost.prefetch(all);
  return layer_cost;
}

void resolve_across_layers_by_walks(const RunInputs& in, Measure& measure, RunState& state) {
  Refinements& passes = state.refinements;
  passes.divergence_by_resolve = {state.walk.divergence};
  const std::optional<ResolvedMove> move = propose_resolve(in, state);
  if (!move) return;
  spdlog::info(
      "re-solve: the exact solve over the conditioned curves moves layer {} to [{}]; re-deciding "
      "the layers above it",
      move->lowest, fmt::join(move->windows.at(move->lowest), ","));
  Snapshot kept = snapshot_of(state);
  const double walked = kept.walk.divergence;
  rewalk_above_fixed(in, measure, state, move->lowest, move->windows);
  const double rewalked = state.walk.divergence;
  passes.divergence_by_resolve.push_back(rewalked);
  const bool better = in.options.stable_decisions ? noise::stable_refinement_kept(walked, rewalked)
                                                  : rewalked < walked;
  if (!better) {
    spdlog::info("re-solved walk: {} {:.6g}, not below {:.6g}: kept the first walk's policy",
                 in.measured_label(), rewalked, walked);
    roll_back(state, std::move(kept));
    return;
  }
  spdlog::info("re-solved walk: {} {:.6g} (was {:.6g}): kept", in.measured_label(), rewalked,
               walked);
  passes.resolves = 1;
}

// Puts into `stream` the hidden states entering global layer `layer`, the layers below it run
// under `windows`: from the walk's highest checkpoint that ran them so, the layers between it and
// `layer` run again.
void enter_layer(const RunInputs& in, const RunState& state, int64_t layer, const Windows& windows,
                 ActivationStream& stream) {
  PolicyAttentionCore core(windows, in.options.sink_tokens, in.model.attention_chunk());
  for (int64_t i = state.stream_checkpoints.restore(stream, layer, windows); i < layer; ++i) {
    stream.apply([&](const at::Tensor& h) { return run_checked(in, i, h, core); });
    in.model.release_layer(i);
  }
}

void resolve_across_layers_on_the_span(const RunInputs& in, AnswerSpan& span, RunState& state) {
  Refinements& passes = state.refinements;
  passes.divergence_by_resolve = {state.walk.divergence};
  std::optional<ResolvedMove> move = propose_resolve(in, state);
  if (!move) return;
  spdlog::info(
      "re-solve: the exact solve over the conditioned curves moves layer {} to [{}]; checking it "
      "against the walk's policy on the answer span",
      move->lowest, window_labels(move->windows.at(move->lowest)));
  ActivationStream stream(in.model, in.local_sequences, in.options.micro_batch,
                          in.options.activations);
  const Windows& policy = state.completion.windows;
  enter_layer(in, state, move->lowest, policy, stream);
  passes.span_by_resolve =
      span.evaluate_policies(move->lowest, stream, {policy, move->windows}, "re-solve");
  const double walked = passes.span_by_resolve.at(0);
  const double resolved = passes.span_by_resolve.at(1);
  // --decisions stable: a point comparison of two policies moves with the seed where they are
  // close, so the re-solve is kept only for a gain of the minimum effect (noise/stable_choice.hpp).
  const bool better = in.options.stable_decisions ? noise::stable_refinement_kept(walked, resolved)
                                                  : resolved < walked;
  if (!better) {
    spdlog::info("re-solved policy: span {} {:.6g}, not below the walk's {:.6g}: kept the walk's",
                 in.measured_label(), resolved, walked);
    return;
  }
  spdlog::info("re-solved policy: span {} {:.6g} (the walk's {:.6g}): kept", in.measured_label(),
               resolved, walked);
  const int64_t walked_bytes = state.completion.bytes_before;
  state.decisions.spent = layer_bytes(state.decisions.groups, move->choice);
  state.decisions.choice = std::move(move->choice);
  complete(in, state);
  state.completion.bytes_before = walked_bytes;
  passes.resolves = 1;
}

class SpanMeasure final : public Measure {
 public:
  // The job's span (its reference done, shared with the keep-rules pass), or one of its own.
  SpanMeasure(const RunInputs& in, RunState& state) : span_(in.options.span) {
    if (span_ == nullptr) {
      own_span_ = std::make_unique<AnswerSpan>(in.model, in.local_sequences, in.local_answers,
                                               answer_span_options(in.options), in.world);
      span_ = own_span_.get();
    }
    if (!in.options.validate_measure) return;
    state.validation.emplace();
    spdlog::info(
        "validation (exact measure): full-KV reference at the answer positions ({} "
        "sequences)",
        in.local_sequences.size());
    exact_ = std::make_unique<AnswerReference>(
        in.model, in.local_sequences, in.local_answers, in.options.micro_batch,
        in.options.sink_tokens, in.world, measure_traits(in.options.measure).divergence);
  }

  int64_t probe_samples(const RunInputs& in, const RunState& state) const override {
    return span_probe_samples(in, state);
  }

  void probe(const RunInputs& in, RunState& state) override {
    span_probe(in, *span_, exact_.get(), state, probe_sequences_);
  }

  LayerDecision decide_and_run(const RunInputs& in, RunState& state, const Decisions& walked,
                               int64_t layer, ActivationStream& stream,
                               LayerReport& report) override {
    if (decides_in_its_pass(in, state, layer, stream))
      return run_deciding_in_its_pass(in, state, walked, layer, stream, report);
    LayerDecision decision = decide_jointly(
        in, state, walked, layer, joint_source(in, state, layer, stream, nullptr), report);
    captured_.reset();  // the decision is taken: its site is no longer referred to
    run_layer_at(in, layer, decision.windows, stream);
    return decision;
  }

  double value_of_walk(ActivationStream& final_stream) override {
    return span_->evaluate_final(final_stream);
  }

  // One re-solve at most, checked on the answer span (or judged by the re-walk's own final
  // stream): no forward over every token beyond what the check needs.
  void refine_after_completion(const RunInputs& in, RunState& state) override {
    if (!in.options.conditioned) return;
    if (in.options.resolve_by_rewalk) {
      resolve_across_layers_by_walks(in, *this, state);
    } else {
      resolve_across_layers_on_the_span(in, *span_, state);
    }
  }

 private:
  // The layer's joint decision on the span. The lowest global layer sees the full-KV stream the
  // probe measured (nothing below it is cut): its probe values are the decision's too. `given`:
  // the layer's site when its own pass captured it; else the reference site (lowest layer) or a
  // site captured here from `stream` (kept in captured_ while the decision refers to it).
  JointLayerSource joint_source(const RunInputs& in, RunState& state, int64_t layer,
                                ActivationStream& stream, const SpanSite* given) {
    const bool lowest =
        layer == in.spec.global_layer_ids().front() && state.probe_memo.contains(layer);
    JointLayerSource source;
    // The decision's per-sequence values: the probe's for the lowest layer (its values too).
    decision_sequences_.clear();
    if (lowest) decision_sequences_ = probe_sequences_;
    if (lowest)
      source.seed = [&state, layer](LevelMemo& memo) { memo = state.probe_memo.at(layer); };
    source.measure = [this, &in, layer, &stream, lowest, given](LevelMemo& memo) {
      return span_decision_measure(in, *span_, layer, stream, lowest, given, memo,
                                   decision_sequences_, captured_);
    };
    source.per_sequence = [this](const std::vector<size_t>& levels) -> const SequenceValues* {
      const auto it = decision_sequences_.find(levels);
      return it == decision_sequences_.end() ? nullptr : &it->second;
    };
    if (state.validation) {
      source.validate = [this, &in, &state, layer, &stream](const std::vector<size_t>& assign,
                                                            const JointMeasure& joint,
                                                            const std::vector<solve::Group>& groups,
                                                            int64_t allowance, double price) {
        validate_joint_decision(in, *exact_, layer, stream, assign, joint, groups, allowance, price,
                                /*with_own_decision=*/true, state);
      };
    }
    return source;
  }

  // Whether the walk decides global layer `i` inside the layer's own pass over `stream`: one
  // micro-batch, no state, the layer's weights resident beside the sweep, not the lowest layer
  // (decided on the reference), not validating.
  static bool decides_in_its_pass(const RunInputs& in, const RunState& state, int64_t i,
                                  const ActivationStream& stream) {
    return in.options.conditioned && in.options.measured_layer_resident &&
           stream.micro_batches() == 1 && in.spec.layer(i).states.empty() && !state.validation &&
           i != in.spec.global_layer_ids().front();
  }

  // Runs global layer `i` once over `stream`, deciding its windows from the attention inputs of
  // the pass itself: one pass over the layer instead of a capture and a propagation.
  LayerDecision run_deciding_in_its_pass(const RunInputs& in, RunState& state,
                                         const Decisions& walked, int64_t i,
                                         ActivationStream& stream, LayerReport& report) {
    std::vector<at::Tensor> input;  // the layer's input at the span, set before the pass
    LayerDecision decision;
    DecidingCore core(in.options.sink_tokens, in.model.attention_chunk(),
                      [&](const arch::AttentionInputs& attention) {
                        const SpanSite site = span_->site_of(i, std::move(input), {attention});
                        decision =
                            decide_jointly(in, state, walked, i,
                                           joint_source(in, state, i, stream, &site), report);
                        return decision.windows;
                      });
    stream.apply([&](const at::Tensor& h) {
      input = {h.slice(1, span_->span_begin(), h.size(1)).clone()};
      return run_checked(in, i, h, core);
    });
    return decision;
  }

  AnswerSpan* span_ = nullptr;
  std::unique_ptr<AnswerSpan> own_span_;
  std::unique_ptr<AnswerReference> exact_;  // validation only
  std::optional<SpanSite> captured_;
  SequenceMemo probe_sequences_;     // the lowest global layer's, from the probe
  SequenceMemo decision_sequences_;  // the layer being decided
};

std::unique_ptr<Measure> make(const RunInputs& in, RunState& state) {
  return std::make_unique<SpanMeasure>(in, state);
}

}  // namespace

static RegisterMeasure answer_tv_span_registration{DistortionMeasure::kAnswerTvSpan, &make};
static RegisterMeasure answer_kl_span_registration{DistortionMeasure::kAnswerKlSpan, &make};

}  // namespace headwise::calib::seqcalib

namespace headwise::calib {

AnswerSpanOptions answer_span_options(const SeqCalibOptions& options) {
  AnswerSpanOptions so;
  so.micro_batch = options.micro_batch;
  so.sink_tokens = options.sink_tokens;
  so.windows = options.ladder.levels;
  so.margin = options.span_margin;
  so.divergence = measure_traits(options.measure).divergence;
  so.keep_measured_layer = options.measured_layer_resident;
  return so;
}

}  // namespace headwise::calib

#pragma once
// The answer-span measures' own parts of SeqCalib: the probe as one sweep over the reference
// pass's sites, the layer measure on a site (batched, memoised), the decision inside a layer's own
// pass, and the cross-layer re-solve judged by the walks' own final streams.
#include <cstdint>
#include <optional>

#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_span.hpp"
#include "seqcalib_curves.hpp"
#include "seqcalib_run.hpp"

namespace headwise::calib::seqcalib {

// The sequences the span probe measures the layers above the lowest global one on (the lowest is
// measured on every sequence): --probe-samples, every sequence when the run validates its measure.
int64_t span_probe_samples(const RunInputs& in, const RunState& state);

// Every global layer's curves on the full-KV stream (the reference pass's sites), every
// (head, level) of every layer in one sweep over the layers.
void span_probe(const RunInputs& in, const AnswerMeasures& measures, RunState& state);

// The span measure of layer `layer_id`'s joint windows, memoised in `memo`, on the reference
// pass's site (`on_reference_stream`: nothing below the layer is cut), else on `given`, else on a
// site captured from `stream` into `captured` (which the measure refers to). Measures every joint
// assignment of a small layer at once.
LayerMeasure span_decision_measure(const RunInputs& in, AnswerSpan& span, int64_t layer_id,
                                   ActivationStream& stream, bool on_reference_stream,
                                   const SpanSite* given, LevelMemo& memo,
                                   std::optional<SpanSite>& captured);

// Whether the walk decides global layer `i` inside the layer's own pass over `stream`.
bool decides_in_its_pass(const RunInputs& in, const RunState& state, int64_t i,
                         const ActivationStream& stream);

// Runs global layer `i` once over `stream`, deciding its windows from the attention inputs of the
// pass itself.
void run_deciding_in_its_pass(const RunInputs& in, const AnswerMeasures& measures, RunState& state,
                              int64_t i, ActivationStream& stream, LayerReport& report);

// The span measure's cross-layer re-solve (see resolve_across_layers): one pass, kept when the
// re-walk's end-to-end answer divergence (read off its own final stream) is below the first
// walk's, both before their completions: no forward beyond the re-walk itself.
void resolve_across_layers_by_walks(const RunInputs& in, const AnswerMeasures& measures,
                                    RunState& state);

// The default re-solve of the span measures: the exact solve over the conditioned curves is
// proposed, and checked against the walk's completed policy by the span measure of both whole
// policies from the lowest layer it moves (AnswerSpan::evaluate_policies); kept when lower. The
// stream entering that layer comes from the walk's checkpoints: nothing above it runs over every
// token, and nothing is re-decided.
void resolve_across_layers_on_the_span(const RunInputs& in, const AnswerMeasures& measures,
                                       RunState& state);

}  // namespace headwise::calib::seqcalib

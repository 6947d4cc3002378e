#pragma once
// The answer-span measure (`--distortion answer-tv-span`, the default, and `answer-kl-span`):
// what a global layer's windows cost the model's answers at its output, as the exact measure
// (answer_reference.hpp) defines it, at a cost that does not grow with the depth of the model.
//
// The exact measure runs every layer above the measured one over every token once per candidate
// assignment of the layer's windows: Σ_g E_g · (L − 1 − g) layer passes over the calibration
// tokens, quadratic in depth. Here one reference forward at full KV keeps, for every layer, what
// the tokens before the *answer span* [P, T) leave behind for it: an attention layer's keys and
// values (a sliding layer's last window of them), a recurrent or convolution layer's state at P.
// A candidate is then run on the span only: the measured layer's span queries attend over all of
// its keys with the candidate's windows, and each layer above runs the span's S tokens against its
// cache, as a server decodes a question appended to a prompt it already holds. P is the first
// answer position less a margin (the question's own tokens and some context before it). The
// candidates of one decision are batched into one run per layer above, sharing the cached keys.
// Cost per candidate: S / T of the layers above, instead of all of them.
//
// What it approximates. The windows change the measured layer's output at every position; the
// exact measure carries all of it up through the layers above. Here the positions before P keep
// their full-KV representations in the layers above (their caches come from the reference), so
// what the windows do to the prompt's own tokens reaches the answers only through the measured
// layer itself; the span (question and answers) is exact. Conditioning on the layers below is
// kept: the measured layer's input, keys and state come from the stream they produce under their
// chosen windows. docs/seqcalib.md states the cost and the validation against the exact measure.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/sequence_values.hpp"
#include "headwise/dist/collective.hpp"

namespace headwise::calib {

class ActivationStream;
enum class ActivationPlacement;

// Per micro-batch: a global layer's attention output at the span, [Bm, S, heads, hd].
using SpanOutputs = std::vector<at::Tensor>;

// What the candidates of one global layer are made of, on one stream entering it.
struct SpanSite {
  int64_t layer = -1;
  std::vector<at::Tensor> input;  // per micro-batch: the layer's input at the span [Bm, S, hidden]
  std::map<int64_t, SpanOutputs> levels;  // window → attention output with every head at it
  std::vector<arch::LayerState>
      state;  // per micro-batch: the layer's own state at P (stateful layers)
  std::vector<arch::AttentionInputs>
      attention;  // per micro-batch, all positions (only when asked: keep rules)

  // Head h's group of query heads at windows[h] (each a key of `levels`).
  SpanOutputs compose(const std::vector<int64_t>& windows) const;
};

struct AnswerSpanOptions {
  int64_t micro_batch = 1;
  int64_t sink_tokens = 0;
  std::vector<int64_t> windows;  // the levels every site measures (the ladder)
  int64_t margin = 8;            // tokens of the span before the first answer position
  AnswerDivergence divergence = AnswerDivergence::kTv;
  // A sweep keeps its measured (lowest) layer's weights resident, because the walk runs that layer
  // under its decision next. false when two layers' weights do not fit the memory (the calibration
  // memory plan says): the sweep releases it too, and the next use loads it again.
  bool keep_measured_layer = true;
};

struct SeqCalibOptions;
// The span's options as a SeqCalib run with `options` measures on it: one place, so that the
// calibration job's span and a run's own span are the same measure.
AnswerSpanOptions answer_span_options(const SeqCalibOptions& options);

class AnswerSpan {
 public:
  // `sequences`: this rank's shard; `answers[s]` the answer positions of sequence s. Runs the
  // reference forward (full KV) at once: the reference distributions at the answer positions,
  // every layer's cache at P, and every global layer's site on the full-KV stream (the probe's).
  AnswerSpan(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
             const std::vector<std::vector<int64_t>>& answers, const AnswerSpanOptions& options,
             dist::Collective& world = dist::single_process());
  ~AnswerSpan();
  AnswerSpan(const AnswerSpan&) = delete;
  AnswerSpan& operator=(const AnswerSpan&) = delete;

  // The site of global layer `layer` on the full-KV stream.
  const SpanSite& reference_site(int64_t layer) const;
  // The site of global layer `layer` on `stream` (the hidden states entering it): runs the layer's
  // attention inputs once. With `keep_attention`, the site keeps them (for token selection).
  SpanSite capture(int64_t layer, ActivationStream& stream, bool keep_attention = false);
  // The same from what a pass over a stateless layer has at hand: per micro-batch, the layer's
  // input at the span ([Bm, S, hidden]) and its attention inputs at every position.
  SpanSite site_of(int64_t layer, std::vector<at::Tensor> input,
                   const std::vector<arch::AttentionInputs>& attention) const;

  // The mean divergence per answer position (over every rank's answers) of each candidate: the
  // site's layer producing the candidate's attention output at the span, the layers above at
  // full KV. `what` names the evaluation in errors. With `per_sequence`, also each candidate's
  // divergence per sequence of this rank's shard (its local order), which the means pool.
  std::vector<double> evaluate(const SpanSite& site, const std::vector<SpanOutputs>& candidates,
                               const std::string& what,
                               std::vector<SequenceValues>* per_sequence = nullptr);

  struct SweepItem {
    const SpanSite* site = nullptr;
    std::vector<SpanOutputs> candidates;
    // The windows of global layers above the site that the span's queries run under (a whole
    // policy's, evaluate_policies); nullptr: the layers above at full KV.
    const std::map<int64_t, std::vector<int64_t>>* above = nullptr;
    // Measures on this rank's first `sequences` sequences only (their answers' mean); -1: all.
    int64_t sequences = -1;
  };
  // evaluate() for sites of several layers at once: one pass over each layer, the candidates of
  // a lower site passing through the higher sites' layers with theirs (the probe's curves).
  // With `per_sequence`, per item and candidate, the divergence per sequence of this rank's shard
  // (a sequence an item does not measure has 0 answers).
  std::vector<std::vector<double>> sweep(
      const std::vector<SweepItem>& items, const std::string& what,
      std::vector<std::vector<SequenceValues>>* per_sequence = nullptr);

  // The span measure of whole policies that agree below global layer `layer`: per policy, the
  // mean divergence per answer position with `layer` and every global layer above it at the
  // policy's windows on the span's queries (the layers' caches as evaluate() has them). `stream`
  // enters `layer` as the layers below run under every policy. Costs one capture of `layer` and
  // the span through the layers above per policy: what a re-solve's proposal is checked with.
  std::vector<double> evaluate_policies(
      int64_t layer, ActivationStream& stream,
      const std::vector<std::map<int64_t, std::vector<int64_t>>>& policies,
      const std::string& what);

  // Mean divergence per answer position of hidden states that have passed every layer (a walk's
  // final stream), against the reference: exact, no layer runs.
  double evaluate_final(ActivationStream& final_hidden);

  int64_t span_begin() const { return span_begin_; }
  int64_t span_length() const { return span_length_; }
  int64_t answer_count() const { return answers_; }
  AnswerDivergence divergence() const { return options_.divergence; }
  // Layer passes over the span run by evaluations so far (a candidate through one layer counts
  // once), and the calls that ran them (one per layer and batch of candidates).
  int64_t candidate_layer_passes() const { return candidate_layer_passes_; }
  int64_t evaluations() const { return evaluations_; }
  // The caches' bytes (every layer, every micro-batch): the calibration batch's KV up to P.
  int64_t cache_bytes() const;

 private:
  struct LayerCache;
  class Capture;

  // The candidates [c0, c1) of one sweep item on one micro-batch, as span rows through the layers.
  struct SpanBatch {
    size_t item = 0;
    size_t micro_batch = 0;
    size_t c0 = 0, c1 = 0;
    at::Tensor hidden;  // [rows * (c1 - c0), S, H], b-major
    int64_t rows = 0;   // the micro-batch's first rows it measures (SweepItem::sequences)
  };

  void run_reference(const std::vector<std::vector<int64_t>>& sequences);
  void run_above_sites(int64_t layer, std::vector<SpanBatch>& batches,
                       const std::vector<SweepItem>& items);
  // One batch through layer `j` above its site on its own: under a policy's `windows` (nullptr:
  // the layer as it is), against the first batch.rows rows of the layer's cache.
  void run_alone(int64_t j, SpanBatch& batch, const std::vector<int64_t>* windows);
  at::Tensor log_probs_at_answers(int64_t micro_batch, const at::Tensor& final_hidden,
                                  int64_t first_row);

  arch::DecoderModel& model_;
  AnswerSpanOptions options_;
  dist::Collective* world_;
  int64_t steps_ = 0;
  int64_t span_begin_ = 0;   // P
  int64_t span_length_ = 0;  // S = T - P
  std::vector<int64_t> micro_batch_rows_;
  std::vector<at::Tensor> answer_rows_;     // per micro-batch: the sequence of each answer position
  std::vector<at::Tensor> answer_columns_;  // per micro-batch: its position
  std::vector<at::Tensor> reference_;       // per micro-batch: [answers, vocab] full-KV log-probs
  int64_t answers_ = 0;
  std::vector<std::vector<LayerCache>> caches_;  // [layer][micro-batch]
  std::map<int64_t, SpanSite> reference_sites_;
  int64_t candidate_layer_passes_ = 0;
  int64_t evaluations_ = 0;
};

}  // namespace headwise::calib

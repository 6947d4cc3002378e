#pragma once
// The gradient-based answer measure (`--distortion answer-grad`): what a global layer's windows
// cost the answers, predicted from gradients instead of one run of the layers above per window
// assignment (answer-kl).
//
// At each answer position a, let y*_a be the full model's answer (its argmax there) and
// M_a = log p(y*_a) - log(1 - p(y*_a)) the run's log-odds of it. Cutting a head moves M_a; to
// first order by s_a(h, w) = ∇_o M_a · Δ_h(w), where o is the measured layer's attention output
// with every head at full KV on the conditioned stream, Δ_h(w) the change of head h's slice of o
// at window w, and the gradient comes back through the rest of the layer and every layer above.
// The prediction is the exact two-class KL at the moved log-odds,
//
//   KL_a = KL( (q_a, 1 - q_a) || (σ(M_a + Σ_h s_a(h, w_h)), 1 - σ(...)) ),  q_a = p_full(y*_a),
//
// minus the same at s = 0, averaged over the answer positions.
// Why log-odds and not the loss itself: a model that has retrieved the needle is confident, the
// gradient of log p (or of the KL, or its Fisher term) vanishes there, and a second-order
// expansion predicts ~0 for a cut that flips the answer. The log-odds move linearly with the
// head's output even when saturated; the sigmoid then applies the saturation exactly. The heads
// write disjoint slices of o, so the shifts of a joint assignment add up *inside* the sigmoid:
// four heads that each move the log-odds by a third of the margin cost little alone and flip the
// answer together, which is how the heads of a layer back each other up.
//
// A first-order model cannot see redundancy that saturates: when two heads each write more than
// the layers above can use, the gradient at full KV is zero for either and for both. SeqCalib
// therefore re-linearises at the layer's tentative windows (prepare(at_windows)) and improves the
// decision there until no move helps (seqcalib_decide.cpp).
//
// Cost per global layer, micro-batch and linearisation point: the layer once, the layers above
// once without a graph (their inputs kept: activation checkpointing), then each layer above
// recomputed with its graph once and back-propagated once per answer slot (the j-th answer of
// every sequence: sequences do not mix, the positions of one sequence do); memory stays at one
// layer's graph. (Repeating the layer's input once per slot along the batch, one backward for
// all, was measured slower on CPU: 28 s against 15 s for the default model's layer 1.) When no
// layer above mixes positions (the measured layer is the last), one slot serves every answer. The
// ladder's single-window attention outputs come from one multi-window pass and are reused across
// linearisation points.
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/calib/answer_reference.hpp"

namespace headwise::calib {

class ActivationStream;

class AnswerSensitivity {
 public:
  // `reference`: the full-KV answer distributions of the same sequences, micro-batched the same
  // way as the streams passed to prepare(). `ladder`: the window of each level index.
  AnswerSensitivity(arch::DecoderModel& model, AnswerReference& reference,
                    std::vector<int64_t> ladder, int64_t sink_tokens);

  // Measures `layer` on `stream` (the hidden states entering it), linearised at the layer's KV
  // heads running at `at_windows` (empty: full KV): after this, predict() answers for this layer.
  // A call with `at_windows` empty starts the layer afresh; later calls for the same layer must
  // pass the same stream (its single-window attention outputs are reused).
  void prepare(int64_t layer, ActivationStream& stream,
               const std::vector<int64_t>& at_windows = {});

  // The predicted mean answer KL per answer position when the layer's KV heads run at ladder
  // levels `levels`, relative to every head at the top level (0 there; clamped at 0).
  double predict(const std::vector<size_t>& levels) const;

  int64_t layer() const { return layer_; }
  // Backward passes through the layers above in the last prepare(), summed over micro-batches.
  int64_t backward_passes() const { return backward_passes_; }

 private:
  struct Answer {
    double log_odds = 0.0;      // M_a on the run at the linearisation point
    double reference = 0.0;     // q_a
    std::vector<double> shift;  // s_a per (head, level)
  };
  struct Slots {
    std::vector<at::Tensor> cotangents;  // d(Σ M of the slot's answers)/d(final hidden), per slot
    std::vector<int64_t> slot;           // per answer of the micro-batch
    std::vector<int64_t> row;
    std::vector<int64_t> position;
  };
  void accumulate(int64_t micro_batch, const at::Tensor& entering);
  void gather_answers_of_every_rank();
  Slots answer_slots(int64_t micro_batch, const at::Tensor& final_hidden, bool separable);

  arch::DecoderModel& model_;
  AnswerReference& reference_;
  std::vector<int64_t> ladder_;
  int64_t sink_tokens_;
  int64_t layer_ = -1;
  std::vector<int64_t> at_windows_;  // the linearisation point
  size_t heads_ = 0;
  size_t levels_ = 0;
  std::vector<Answer> answers_;
  LevelCache levels_cache_;  // fp32 single-window outputs of the measured layer
  int64_t backward_passes_ = 0;
};

// Spearman's rank correlation (average ranks for ties); NaN when either side is constant or the
// sizes differ or are below 2.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace headwise::calib

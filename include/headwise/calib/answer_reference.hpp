#pragma once
// The answer-aware distortion (`--distortion answer-kl`): what a global layer's windows cost the
// model's *answers*, measured at the output. The hidden states entering the layer (the stream
// the layers below produce under their chosen windows) are run through the layer with the
// windows under test and through every layer above it with full KV, and the next-token
// distributions at the answer positions are compared with the full model's (KL(full || run)).
//
// Why not the block-output error: in a needle sequence the positions that need far context
// are ~1% of all positions, so an all-position average calls a retrieval head cheap; and the
// heads of a layer back each other up, which only a measure of the *joint* windows sees.
// DuoAttention scores final hidden states at answer positions only; this is the same idea
// carried to the logits.
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/core/exact_sum.hpp"
#include "headwise/dist/collective.hpp"

namespace headwise::calib {

class ActivationStream;

// answer-tv-span / answer-kl-span: the same divergences measured on the answer span against cached
// layers (answer_span.hpp), at a cost that does not grow with depth; answer-tv-span is the default.
enum class DistortionMeasure {
  kBlockMse,
  kAnswerKl,
  kAnswerTv,
  kAnswerGrad,
  kAnswerTvSpan,
  kAnswerKlSpan
};

// "block-mse", "answer-kl", "answer-tv", "answer-grad", "answer-tv-span" or "answer-kl-span";
// InputError naming --distortion otherwise. What each one needs: measure_traits.hpp.
DistortionMeasure parse_distortion_measure(const std::string& text);
// The name parse_distortion_measure() reads.
const char* distortion_measure_name(DistortionMeasure measure);

// How the answer measures compare a run's next-token distribution q with the full model's p at
// an answer position. KL(p || q) is unbounded: one needle the windows lose outright costs as
// much as many answers made slightly less sure, so a decision that minimises the mean KL spreads
// the long windows to soften every miss (one head at full, its partners cut short) while greedy
// answers stay wrong. The total variation ½·Σ|p − q| is at most 1 per position and bounds the
// change of the probability of any answer (|p(A) − q(A)| ≤ TV for every set A of tokens): a
// lost needle costs at most 1, and keeping most needles exact is what pays.
enum class AnswerDivergence { kKl, kTv };
// The divergence the measure scores: measure_traits().divergence.
AnswerDivergence answer_divergence(DistortionMeasure m);
// "answer KL" or "answer TV", as logs name the measured quantity.
const char* divergence_label(AnswerDivergence divergence);
// Per position: the divergence of `log_q` from the reference `log_p` (log-probs [positions,
// vocab] each) → [positions], in float32.
at::Tensor divergence_per_position(const at::Tensor& log_p, const at::Tensor& log_q,
                                   AnswerDivergence divergence);

// The measured layer's attention output with every head at one window, per (micro-batch,
// window): a joint assignment is then composed head by head (compose_heads) instead of
// recomputed. Both answer measures keep one; outputs are kept while they fit in kBytes.
class LevelCache {
 public:
  static constexpr int64_t kBytes = int64_t{1} << 30;
  // Forgets everything when `layer` is not the layer cached so far.
  void use_layer(int64_t layer) {
    if (layer != layer_) clear();
    layer_ = layer;
  }
  void clear() {
    outputs_.clear();
    bytes_ = 0;
  }
  const at::Tensor* find(int64_t micro_batch, int64_t window) const {
    const auto it = outputs_.find({micro_batch, window});
    return it == outputs_.end() ? nullptr : &it->second;
  }
  bool fits(int64_t bytes) const { return bytes_ + bytes <= kBytes; }
  // Keeps `output` when it fits; either way returns it.
  const at::Tensor& keep(int64_t micro_batch, int64_t window, const at::Tensor& output) {
    const auto bytes = static_cast<int64_t>(output.nbytes());
    if (!fits(bytes)) return output;
    bytes_ += bytes;
    return outputs_.insert_or_assign({micro_batch, window}, output).first->second;
  }

 private:
  int64_t layer_ = -1;
  int64_t bytes_ = 0;
  std::map<std::pair<int64_t, int64_t>, at::Tensor> outputs_;  // → [B, T, heads, hd]
};

// The attention output with KV head h at windows[h], its GQA group of query heads (contiguous)
// copied from level(windows[h]) ([B, T, heads, hd], every head at that window): each head's
// attention depends on its own window only.
at::Tensor compose_heads(std::span<const int64_t> windows,
                         const std::function<at::Tensor(int64_t window)>& level);

class AnswerReference {
 public:
  // `answers[s]`: positions of sequence s whose next-token distribution is scored. Computes the
  // full-KV reference distributions there (one exact forward, micro-batch by micro-batch, split
  // like ActivationStream's). InputError when no sequence has an answer position. `sequences` is
  // this rank's shard; every measure below is the mean over every rank's answers (`world`).
  // `divergence` says what every measure below averages (KL unless told).
  AnswerReference(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
                  const std::vector<std::vector<int64_t>>& answers, int64_t micro_batch,
                  int64_t sink_tokens, dist::Collective& world = dist::single_process(),
                  AnswerDivergence divergence = AnswerDivergence::kKl);

  // The same measure over the first `sequences` sequences only (the probe's), micro-batched the
  // same way: the reference is sliced from this one instead of recomputed.
  AnswerReference prefix(int64_t sequences) const;

  // Mean KL(full || run) per answer position, where `run` takes every micro-batch of `stream`
  // (hidden states entering `layer`) through `layer` with its KV heads at `windows` and through
  // the layers above with full KV. Layers above are released after they run, so the weights
  // held stay at one layer (they stream from the mapped checkpoint again next time).
  double evaluate(int64_t layer, ActivationStream& stream, std::span<const int64_t> windows);

  // The measured layer's attention output [B, T, heads, hd] from its inputs and the micro-batch's
  // index in the stream.
  using LayerAttention =
      std::function<at::Tensor(const arch::AttentionInputs& inputs, int64_t micro_batch)>;
  // As evaluate(), with the measured layer's attention given by `attention` (keep rules: some heads
  // choose tokens online); `what` names the assignment in errors.
  double evaluate_attention(int64_t layer, ActivationStream& stream,
                            const LayerAttention& attention, const std::string& what);

  // Mean KL(full || run) per answer position for a whole-model assignment: `embedded` holds the
  // embeddings (hidden states entering layer 0), every global layer runs at `windows`.
  double evaluate_policy(ActivationStream& embedded,
                         const std::map<int64_t, std::vector<int64_t>>& windows);

  // Mean KL(full || run) per answer position of hidden states that have passed every layer
  // already (a walk's stream after its last layer): no layer runs.
  double evaluate_final(ActivationStream& final_hidden);

  // Answer positions over every rank.
  int64_t answer_count() const { return answers_; }
  AnswerDivergence divergence() const { return divergence_; }
  dist::Collective& world() const { return *world_; }
  int64_t evaluations() const { return evaluations_; }

  // Log-probs [answers of the micro-batch, vocab] at its answer positions of `final_hidden`
  // (hidden states after the last layer), and the full-KV reference there.
  at::Tensor output_log_probs(int64_t micro_batch, const at::Tensor& final_hidden);
  const at::Tensor& reference(int64_t micro_batch) const {
    return reference_.at(static_cast<size_t>(micro_batch));
  }
  // The sequence (row of the micro-batch) of each of its answer positions, on the model's device.
  const at::Tensor& answer_rows(int64_t micro_batch) const {
    return batch_index_.at(static_cast<size_t>(micro_batch));
  }
  // The position of each of its answer positions, on the model's device.
  const at::Tensor& answer_columns(int64_t micro_batch) const {
    return position_index_.at(static_cast<size_t>(micro_batch));
  }

 private:
  // evaluate() and evaluate_attention(): the measured layer at `windows`, or by `attention` when
  // given.
  double evaluate_layer(int64_t layer, ActivationStream& stream, std::span<const int64_t> windows,
                        const LayerAttention* attention, const std::string& what);
  // The divergence summed over the micro-batch's answer positions.
  double divergence_sum(int64_t micro_batch, const at::Tensor& final_hidden);
  void share_answer_counts(const std::string& what);
  double mean_over_ranks(const ExactSum& local, const std::string& what) const;
  // Runs layers [first, num_layers) on `hidden` with `core`, each layer's weights released after
  // it; with `check`, every layer's output is checked finite (named by layer).
  at::Tensor run_layers_from(int64_t first, at::Tensor hidden, arch::AttentionCore& core,
                             bool check);

 public:
  static constexpr int64_t kLevelCacheBytes = LevelCache::kBytes;

 private:
  LevelCache cache_;
  int64_t first_answer_ = 0;  // the earliest answer position of any sequence

  arch::DecoderModel& model_;
  int64_t sink_tokens_;
  std::vector<at::Tensor> batch_index_;     // per micro-batch: sequence of each answer position
  std::vector<at::Tensor> position_index_;  // per micro-batch: its position
  std::vector<at::Tensor> reference_;       // per micro-batch: [answers, vocab] full-KV log-probs
  int64_t answers_ = 0;
  int64_t evaluations_ = 0;
  int64_t micro_batch_ = 1;
  dist::Collective* world_;
  AnswerDivergence divergence_ = AnswerDivergence::kKl;
};

}  // namespace headwise::calib

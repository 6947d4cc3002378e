#include "headwise/calib/answer_reference.hpp"

#include "calib/data/answer_positions.hpp"

#include <limits>
#include <vector>

#include "calib/walk/finite_checks.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"

namespace headwise::calib {
namespace {

// `layer` at the windows under test; every other layer as the model defines it (exact for
// global layers, sliding for local ones). Two savings that change no answer-position value:
//  - the measured layer's output is composed head by head from cached single-window outputs;
//  - in the model's last layer, when it is an attention layer, only queries from the first
//    answer position on are computed: nothing after it mixes positions, so earlier rows reach
//    no answer.
class OneLayerWindowsCore final : public arch::AttentionCore {
 public:
  OneLayerWindowsCore(int64_t layer, std::span<const int64_t> windows, int64_t sink_tokens,
                      int64_t chunk, int64_t last_layer, int64_t first_answer, LevelCache& cache)
      : layer_(layer),
        windows_(windows),
        sink_tokens_(sink_tokens),
        chunk_(chunk),
        last_layer_(last_layer),
        first_answer_(first_answer),
        cache_(cache) {}

  void set_micro_batch(int64_t m) { micro_batch_ = m; }
  // The measured layer's attention from a function instead of `windows` (keep rules).
  void set_measured(const AnswerReference::LayerAttention* measured) { measured_ = measured; }

  at::Tensor attend(const arch::AttentionInputs& in) override {
    if (measured_ != nullptr && in.layer_id == layer_) return (*measured_)(in, micro_batch_);
    const int64_t first_query = in.layer_id == last_layer_ ? first_answer_ : 0;
    if (in.layer_id != layer_ || in.sliding_window > 0) {
      const int64_t window = in.sliding_window > 0 ? in.sliding_window : kFullWindow;
      const std::vector<int64_t> same(static_cast<size_t>(in.k.size(1)), window);
      return arch::windowed_attention(in, same, 0, chunk_, first_query);
    }
    if (first_query > 0)
      return arch::windowed_attention(in, windows_, sink_tokens_, chunk_, first_query);
    return composed(in);
  }

 private:
  at::Tensor level_output(const arch::AttentionInputs& in, int64_t window) {
    if (const at::Tensor* cached = cache_.find(micro_batch_, window)) return *cached;
    return cache_.keep(micro_batch_, window,
                       arch::windowed_attention(in, window, sink_tokens_, chunk_));
  }

  at::Tensor composed(const arch::AttentionInputs& in) {
    cache_.use_layer(layer_);
    return compose_heads(windows_, [&](int64_t window) { return level_output(in, window); });
  }

  int64_t layer_;
  std::span<const int64_t> windows_;
  int64_t sink_tokens_;
  int64_t chunk_;
  int64_t last_layer_;
  int64_t first_answer_;
  LevelCache& cache_;
  int64_t micro_batch_ = 0;
  const AnswerReference::LayerAttention* measured_ = nullptr;
};

// The model's last layer when it is an attention layer (its earlier rows feed nothing), else -1.
int64_t last_attention_layer(const arch::ModelSpec& spec) {
  const auto& last = spec.layer(spec.num_layers() - 1);
  return last.attention ? last.id : -1;
}

}  // namespace

at::Tensor compose_heads(std::span<const int64_t> windows,
                         const std::function<at::Tensor(int64_t window)>& level) {
  const auto num_kv = static_cast<int64_t>(windows.size());
  at::Tensor out;
  int64_t group = 0;
  for (int64_t h = 0; h < num_kv; ++h) {
    const at::Tensor one = level(windows[static_cast<size_t>(h)]);
    if (!out.defined()) {
      out = at::empty_like(one);
      group = one.size(2) / num_kv;
    }
    out.slice(2, h * group, (h + 1) * group).copy_(one.slice(2, h * group, (h + 1) * group));
  }
  return out;
}

const char* divergence_label(AnswerDivergence divergence) {
  return divergence == AnswerDivergence::kTv ? "answer TV" : "answer KL";
}

at::Tensor divergence_per_position(const at::Tensor& log_p, const at::Tensor& log_q,
                                   AnswerDivergence divergence) {
  if (divergence == AnswerDivergence::kTv) return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1);
  return (log_p.exp() * (log_p - log_q)).sum(-1);
}

AnswerReference::AnswerReference(arch::DecoderModel& model,
                                 const std::vector<std::vector<int64_t>>& sequences,
                                 const std::vector<std::vector<int64_t>>& answers,
                                 int64_t micro_batch, int64_t sink_tokens, dist::Collective& world,
                                 AnswerDivergence divergence)
    : model_(model),
      sink_tokens_(sink_tokens),
      micro_batch_(micro_batch),
      world_(&world),
      divergence_(divergence) {
  HEADWISE_CHECK(micro_batch > 0 && (!sequences.empty() || world.world_size() > 1),
                 "empty calibration batch");
  if (answers.size() != sequences.size()) {
    throw_input_error("answer-kl: {} answer lists for {} calibration sequences", answers.size(),
                      sequences.size());
  }
  MicroBatchAnswers indexed =
      index_answers(sequences, answers, micro_batch, model.device(), "answer-kl");
  first_answer_ = indexed.first;
  answers_ += indexed.count;
  batch_index_ = std::move(indexed.rows);
  position_index_ = std::move(indexed.columns);
  share_answer_counts("answer positions");
  if (answers_ == 0)
    throw_field_error("distortion",
                      " answer-kl: the calibration sequences have no answer positions");

  // The reference: the full model, one micro-batch at a time (no second copy of the stream).
  // This first pass over every layer names a bad weight, by head or by layer, before it turns
  // every measured KL into NaN.
  CheckedExactCore checked(model.attention_chunk());
  for (size_t m = 0, begin = 0; begin < sequences.size();
       ++m, begin += static_cast<size_t>(micro_batch)) {
    const size_t end = std::min(sequences.size(), begin + static_cast<size_t>(micro_batch));
    const at::Tensor embedded = model.embed(token_batch(sequences, begin, end).to(model.device()));
    reference_.push_back(
        output_log_probs(static_cast<int64_t>(m), run_layers_from(0, embedded, checked, true)));
  }
}

// Every rank scores its shard's answers; the mean is over all of them, and the last layer
// computes its queries from the earliest answer of any shard, as one process would.
void AnswerReference::share_answer_counts(const std::string& what) {
  answers_ = dist::sum_all(*world_, answers_, what + ": count");
  first_answer_ = dist::min_all(*world_, first_answer_, what + ": earliest");
}

double AnswerReference::mean_over_ranks(const ExactSum& local, const std::string& what) const {
  return dist::sum_all(*world_, local, what).value() / static_cast<double>(answers_);
}

AnswerReference AnswerReference::prefix(int64_t sequences) const {
  HEADWISE_CHECK(sequences > 0 || world_->world_size() > 1, "answer-kl: empty prefix");
  AnswerReference out = *this;
  out.cache_.clear();
  out.evaluations_ = 0;
  out.batch_index_.clear();
  out.position_index_.clear();
  out.reference_.clear();
  out.answers_ = 0;
  out.first_answer_ = std::numeric_limits<int64_t>::max();
  for (size_t m = 0; m < reference_.size() && static_cast<int64_t>(m) * micro_batch_ < sequences;
       ++m) {
    // Rows of this micro-batch that belong to the prefix (rows are sorted by sequence).
    const int64_t rows = std::min(micro_batch_, sequences - static_cast<int64_t>(m) * micro_batch_);
    const at::Tensor keep = at::nonzero(batch_index_[m] < rows).squeeze(1);
    out.batch_index_.push_back(batch_index_[m].index_select(0, keep));
    out.position_index_.push_back(position_index_[m].index_select(0, keep));
    out.reference_.push_back(reference_[m].index_select(0, keep));
    out.answers_ += keep.size(0);
    if (keep.size(0) > 0) {
      out.first_answer_ =
          std::min(out.first_answer_, out.position_index_.back().min().item<int64_t>());
    }
  }
  out.share_answer_counts("probe answer positions");
  if (out.answers_ == 0)
    throw_field_error("distortion", " answer-kl: the probe sequences have no answer positions");
  return out;
}

at::Tensor AnswerReference::run_layers_from(int64_t first, at::Tensor hidden,
                                            arch::AttentionCore& core, bool check) {
  for (int64_t i = first; i < model_.spec().num_layers(); ++i) {
    model_.prefetch_layer(i + 1);
    hidden = model_.run_layer(i, hidden, {&core, nullptr, 0});
    if (check) hidden = checked_finite(std::move(hidden), i, model_.spec().layer(i).kind);
    model_.release_layer(i);
  }
  return hidden;
}

at::Tensor AnswerReference::output_log_probs(int64_t micro_batch, const at::Tensor& final_hidden) {
  const auto m = static_cast<size_t>(micro_batch);
  // Only the answer positions reach the head: [1, answers, hidden] → [answers, vocab].
  const at::Tensor picked = final_hidden.index({batch_index_[m], position_index_[m]}).unsqueeze(0);
  return at::log_softmax(model_.logits(picked).squeeze(0).to(at::kFloat), -1);
}

double AnswerReference::evaluate(int64_t layer, ActivationStream& stream,
                                 std::span<const int64_t> windows) {
  return evaluate_layer(layer, stream, windows, nullptr,
                        fmt::format("layer {}: {} at windows [{}]", layer,
                                    divergence_label(divergence_), fmt::join(windows, ",")));
}

double AnswerReference::evaluate_attention(int64_t layer, ActivationStream& stream,
                                           const LayerAttention& attention,
                                           const std::string& what) {
  return evaluate_layer(
      layer, stream, {}, &attention,
      fmt::format("layer {}: {} with {}", layer, divergence_label(divergence_), what));
}

double AnswerReference::evaluate_layer(int64_t layer, ActivationStream& stream,
                                       std::span<const int64_t> windows,
                                       const LayerAttention* attention, const std::string& what) {
  OneLayerWindowsCore core(layer, windows, sink_tokens_, model_.attention_chunk(),
                           last_attention_layer(model_.spec()), first_answer_, cache_);
  core.set_measured(attention);
  ExactSum total;
  int64_t m = 0;
  stream.visit([&](const at::Tensor& entering) {
    core.set_micro_batch(m);
    // The measured layer stays resident: the walk releases it once the layer is decided.
    const at::Tensor out = model_.run_layer(layer, entering, {&core, nullptr, 0});
    total.add(divergence_sum(m++, run_layers_from(layer + 1, out, core, false)));
  });
  ++evaluations_;
  return mean_over_ranks(total, what);
}

double AnswerReference::evaluate_policy(ActivationStream& embedded,
                                        const std::map<int64_t, std::vector<int64_t>>& windows) {
  PolicyAttentionCore core(windows, sink_tokens_, model_.attention_chunk());
  ExactSum total;
  int64_t m = 0;
  embedded.visit([&](const at::Tensor& entering) {
    total.add(divergence_sum(m++, run_layers_from(0, entering, core, false)));
  });
  return mean_over_ranks(total, fmt::format("the policy's end-to-end {} (after the last layer)",
                                            divergence_label(divergence_)));
}

double AnswerReference::evaluate_final(ActivationStream& final_hidden) {
  ExactSum total;
  int64_t m = 0;
  final_hidden.visit([&](const at::Tensor& hidden) { total.add(divergence_sum(m++, hidden)); });
  return mean_over_ranks(total, fmt::format("the walk's end-to-end {} (after the last layer)",
                                            divergence_label(divergence_)));
}

double AnswerReference::divergence_sum(int64_t micro_batch, const at::Tensor& final_hidden) {
  const at::Tensor log_p = output_log_probs(micro_batch, final_hidden);
  const at::Tensor& ref = reference_[static_cast<size_t>(micro_batch)];
  // Per-position sums in fp64, added in a fixed order: reproducible, independent of timing and,
  // past 32768 answer positions in one micro-batch, of the thread count (reproducible_math.hpp).
  return thread_count_independent_sum(divergence_per_position(ref, log_p, divergence_), at::kDouble)
      .item<double>();
}

}  // namespace headwise::calib

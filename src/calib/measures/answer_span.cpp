// The answer-span measure: its reference pass and its sites. See answer_span.hpp; the
// evaluations and sweeps are in answer_span_sweep.cpp.
#include "headwise/calib/answer_span.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "calib/data/answer_positions.hpp"
#include "calib/measures/answer_span_parts.hpp"
#include "calib/measures/span_attention.hpp"
#include "calib/walk/finite_checks.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/exact_sum.hpp"
#include "headwise/core/units.hpp"

namespace headwise::calib {

using namespace answer_span_parts;

SpanOutputs SpanSite::compose(const std::vector<int64_t>& windows) const {
  SpanOutputs out;
  for (size_t m = 0; m < input.size(); ++m) {
    out.push_back(compose_heads(windows, [&](int64_t window) -> at::Tensor {
      const auto it = levels.find(window);
      HEADWISE_CHECK(it != levels.end(), "answer span: layer {} has no output at window {}", layer,
                     window);
      return it->second.at(m);
    }));
  }
  return out;
}

// Runs one layer over one micro-batch, keeping what the measure needs of it: the keys and values
// before P the span may see, the states at P (a stateful layer runs in two parts, [0, P) then
// [P, T), so that its state at P exists), and for a site the layer's attention output at the span
// for each window. The returned output is the layer's at full KV, its span rows computed as the
// evaluations compute them (against the cache), so a full-KV candidate reproduces the reference.
class AnswerSpan::Capture final : public arch::AttentionCore {
 public:
  Capture(int64_t span_begin, int64_t sinks, int64_t chunk,
          const std::vector<int64_t>* site_windows, bool need_prefix_output)
      : span_begin_(span_begin),
        sinks_(sinks),
        chunk_(chunk),
        site_windows_(site_windows),
        need_prefix_output_(need_prefix_output) {}

  at::Tensor run(arch::DecoderModel& model, int64_t layer, const at::Tensor& hidden,
                 LayerCache& cache, std::map<int64_t, at::Tensor>* levels,
                 arch::AttentionInputs* keep) {
    cache_ = &cache;
    levels_ = levels;
    keep_ = keep;
    const int64_t steps = hidden.size(1);
    if (!stateful(model.spec().layer(layer))) {
      part_ = Part::kWhole;
      return model.run_layer(layer, hidden, {this, nullptr, 0});
    }
    arch::LayerState state;
    std::vector<at::Tensor> outputs;
    if (span_begin_ > 0) {
      part_ = Part::kPrefix;
      outputs.push_back(model.run_layer(layer, hidden.slice(1, 0, span_begin_), {this, &state, 0}));
    }
    for (const auto& [name, t] : state) cache.state[name] = t.clone();
    part_ = Part::kSpan;
    outputs.push_back(
        model.run_layer(layer, hidden.slice(1, span_begin_, steps), {this, &state, span_begin_}));
    return outputs.size() == 1 ? outputs.front() : at::cat(outputs, 1);
  }

  // One whole pass's attention inputs of a stateless layer, outside a layer run.
  void attend_whole(const arch::AttentionInputs& in, LayerCache& cache,
                    std::map<int64_t, at::Tensor>* levels) {
    cache_ = &cache;
    levels_ = levels;
    keep_ = nullptr;
    part_ = Part::kWhole;
    attend(in);
  }

  at::Tensor attend(const arch::AttentionInputs& in) override {
    // A measured (global) layer's bad head is named here, before its NaN spreads to every head's
    // output and the layers above.
    if (levels_ != nullptr) check_heads_finite(in);
    switch (part_) {
      case Part::kWhole: {
        if (keep_ != nullptr) *keep_ = in;
        std::vector<at::Tensor> out;
        if (span_begin_ > 0)
          out.push_back(prefix(slice_rows(in, 0, span_begin_)));
        else
          remember_keys(in, 0);
        out.push_back(span(slice_rows(in, span_begin_, in.q.size(2))));
        return out.size() == 1 ? out.front() : at::cat(out, 1);
      }
      case Part::kPrefix:
        if (keep_ != nullptr) *keep_ = in;
        return prefix(in);
      case Part::kSpan:
        if (keep_ != nullptr) *keep_ = keep_->q.defined() ? joined_rows(*keep_, in) : in;
        if (span_begin_ == 0) remember_keys(in, 0);
        return span(in);
    }
    return {};
  }

 private:
  enum class Part { kWhole, kPrefix, kSpan };

  static arch::AttentionInputs slice_rows(const arch::AttentionInputs& in, int64_t begin,
                                          int64_t end) {
    arch::AttentionInputs out = in;
    out.q = in.q.slice(2, begin, end);
    out.k = in.k.slice(2, begin, end);
    out.v = in.v.slice(2, begin, end);
    out.position_offset = in.position_offset + begin;
    return out;
  }

  static arch::AttentionInputs joined_rows(const arch::AttentionInputs& a,
                                           const arch::AttentionInputs& b) {
    arch::AttentionInputs out = a;
    out.q = at::cat({a.q, b.q}, 2);
    out.k = at::cat({a.k, b.k}, 2);
    out.v = at::cat({a.v, b.v}, 2);
    return out;
  }

  // The keys before P the span's queries can see: all of them, or a sliding layer's last window.
  void remember_keys(const arch::AttentionInputs& prefix_in, int64_t first) {
    const int64_t n = prefix_in.k.size(2);
    const int64_t keep_from = in_window_from(prefix_in);
    cache_->keys = {prefix_in.k.slice(2, keep_from, n).clone(),
                    prefix_in.v.slice(2, keep_from, n).clone(), first + keep_from};
  }

  int64_t in_window_from(const arch::AttentionInputs& in) const {
    if (in.sliding_window <= 0) return 0;
    return std::max<int64_t>(0, span_begin_ - in.sliding_window + 1 - in.position_offset);
  }

  at::Tensor prefix(const arch::AttentionInputs& in) {
    remember_keys(in, in.position_offset);
    if (!need_prefix_output_)
      return at::zeros({in.q.size(0), in.q.size(2), in.q.size(1), in.q.size(3)}, in.q.options());
    const std::vector<int64_t> windows(static_cast<size_t>(in.k.size(1)), layer_window(in));
    return arch::windowed_attention(in, windows, 0, chunk_);
  }

  at::Tensor span(const arch::AttentionInputs& in) {
    const KeyBlock own{in.k, in.v, in.position_offset};
    const bool keys_before = span_begin_ > 0;
    const KeyBlock empty{in.k.slice(2, 0, 0), in.v.slice(2, 0, 0), 0};
    const KeyBlock& shared = keys_before ? cache_->keys : empty;
    const at::Tensor out =
        span_attention(in.q, in.position_offset, shared, &own, shape_of(in, layer_window(in), 0));
    if (levels_ != nullptr && site_windows_ != nullptr) {
      for (int64_t w : *site_windows_) {
        (*levels_)[w] = w == kFullWindow ? out
                                         : span_attention(in.q, in.position_offset, shared, &own,
                                                          shape_of(in, w, sinks_));
      }
    }
    if (span_begin_ == 0) cache_->keys = empty;
    return out;
  }

  int64_t span_begin_;
  int64_t sinks_;
  int64_t chunk_;
  const std::vector<int64_t>* site_windows_;
  bool need_prefix_output_;
  Part part_ = Part::kWhole;
  LayerCache* cache_ = nullptr;
  std::map<int64_t, at::Tensor>* levels_ = nullptr;
  arch::AttentionInputs* keep_ = nullptr;
};

AnswerSpan::AnswerSpan(arch::DecoderModel& model,
                       const std::vector<std::vector<int64_t>>& sequences,
                       const std::vector<std::vector<int64_t>>& answers,
                       const AnswerSpanOptions& options, dist::Collective& world)
    : model_(model), options_(options), world_(&world) {
  HEADWISE_CHECK(options.micro_batch > 0 && (!sequences.empty() || world.world_size() > 1),
                 "empty calibration batch");
  if (answers.size() != sequences.size()) {
    throw_input_error("answer span: {} answer lists for {} calibration sequences", answers.size(),
                      sequences.size());
  }
  if (options.margin < 0)
    throw_field_error("span_margin", " must not be negative (got {})", options.margin);
  if (std::find(options_.windows.begin(), options_.windows.end(), kFullWindow) ==
      options_.windows.end()) {
    options_.windows.push_back(
        kFullWindow);  // the reference level every candidate is measured against
  }
  steps_ =
      dist::sum_all(world,
                    sequences.empty() ? int64_t{0} : static_cast<int64_t>(sequences.front().size()),
                    "answer span: steps") /
      std::max<int64_t>(1, dist::sum_all(world, sequences.empty() ? int64_t{0} : int64_t{1},
                                         "answer span: ranks with data"));
  MicroBatchAnswers indexed =
      index_answers(sequences, answers, options.micro_batch, model.device(), "answer span");
  int64_t first_answer = indexed.first;
  micro_batch_rows_ = std::move(indexed.sequences);
  answers_ += indexed.count;
  answer_rows_ = std::move(indexed.rows);
  answer_columns_ = std::move(indexed.columns);
  answers_ = dist::sum_all(world, answers_, "answer span: answer positions");
  first_answer = dist::min_all(world, first_answer, "answer span: earliest answer");
  if (answers_ == 0)
    throw_field_error("distortion", " {}-span: the calibration sequences have no answer positions",
                      options.divergence == AnswerDivergence::kTv ? "answer-tv" : "answer-kl");
  span_begin_ = std::max<int64_t>(0, first_answer - options.margin);
  span_length_ = steps_ - span_begin_;
  run_reference(sequences);
}

AnswerSpan::~AnswerSpan() = default;

void AnswerSpan::run_reference(const std::vector<std::vector<int64_t>>& sequences) {
  const auto& spec = model_.spec();
  const auto micro_batches = micro_batch_rows_.size();
  caches_.assign(static_cast<size_t>(spec.num_layers()), std::vector<LayerCache>(micro_batches));
  ActivationStream stream(model_, sequences, options_.micro_batch, ActivationPlacement::kAuto);
  for (int64_t j = 0; j < spec.num_layers(); ++j) {
    model_.prefetch_layer(j + 1);
    SpanSite* site = nullptr;
    if (spec.layer(j).is_global()) {
      site = &reference_sites_[j];
      site->layer = j;
    }
    size_t m = 0;
    stream.apply([&](const at::Tensor& hidden) {
      std::map<int64_t, at::Tensor> levels;
      if (site != nullptr)
        site->input.push_back(hidden.slice(1, span_begin_, hidden.size(1)).clone());
      Capture capture(span_begin_, options_.sink_tokens, model_.attention_chunk(),
                      site ? &options_.windows : nullptr, true);
      at::Tensor out = capture.run(model_, j, hidden, caches_[static_cast<size_t>(j)][m],
                                   site ? &levels : nullptr, nullptr);
      if (site != nullptr) {
        for (auto& [w, t] : levels) site->levels[w].push_back(t);
        if (stateful(spec.layer(j)))
          site->state.push_back(caches_[static_cast<size_t>(j)][m].state);
      }
      ++m;
      return checked_finite(std::move(out), j, spec.layer(j).kind);
    });
    model_.release_layer(j);
  }
  int64_t m = 0;
  stream.visit([&](const at::Tensor& hidden) {
    reference_.push_back(log_probs_at_answers(m++, hidden, 0));
  });
  spdlog::info("answer span: positions {}..{} of {} ({} tokens) run against caches of {}",
               span_begin_, steps_ - 1, steps_, span_length_, format_bytes(cache_bytes()));
}

at::Tensor AnswerSpan::log_probs_at_answers(int64_t micro_batch, const at::Tensor& final_hidden,
                                            int64_t first_row) {
  const auto m = static_cast<size_t>(micro_batch);
  const at::Tensor picked =
      final_hidden.index({answer_rows_[m], answer_columns_[m] - first_row}).unsqueeze(0);
  return at::log_softmax(model_.logits(picked).squeeze(0).to(at::kFloat), -1);
}

int64_t AnswerSpan::cache_bytes() const {
  int64_t total = 0;
  for (const auto& layer : caches_) {
    for (const auto& c : layer) total += c.bytes();
  }
  return total;
}

const SpanSite& AnswerSpan::reference_site(int64_t layer) const {
  const auto it = reference_sites_.find(layer);
  HEADWISE_CHECK(it != reference_sites_.end(), "answer span: layer {} is not a global layer",
                 layer);
  return it->second;
}

SpanSite AnswerSpan::capture(int64_t layer, ActivationStream& stream, bool keep_attention) {
  HEADWISE_CHECK(model_.spec().layer(layer).is_global(),
                 "answer span: layer {} is not a global layer", layer);
  SpanSite site;
  site.layer = layer;
  stream.visit([&](const at::Tensor& hidden) {
    site.input.push_back(hidden.slice(1, span_begin_, hidden.size(1)).clone());
    LayerCache scratch;
    std::map<int64_t, at::Tensor> levels;
    arch::AttentionInputs kept;
    Capture capture(span_begin_, options_.sink_tokens, model_.attention_chunk(), &options_.windows,
                    false);
    capture.run(model_, layer, hidden, scratch, &levels, keep_attention ? &kept : nullptr);
    for (auto& [w, t] : levels) site.levels[w].push_back(t);
    if (stateful(model_.spec().layer(layer))) site.state.push_back(scratch.state);
    if (keep_attention) site.attention.push_back(kept);
  });
  return site;
}

SpanSite AnswerSpan::site_of(int64_t layer, std::vector<at::Tensor> input,
                             const std::vector<arch::AttentionInputs>& attention) const {
  HEADWISE_CHECK(model_.spec().layer(layer).is_global() && !stateful(model_.spec().layer(layer)),
                 "answer span: layer {} is not a stateless global layer", layer);
  HEADWISE_CHECK(input.size() == attention.size() && input.size() == micro_batch_rows_.size(),
                 "answer span: {} inputs and {} attention inputs for {} micro-batches",
                 input.size(), attention.size(), micro_batch_rows_.size());
  SpanSite site;
  site.layer = layer;
  site.input = std::move(input);
  for (const auto& in : attention) {
    LayerCache scratch;
    std::map<int64_t, at::Tensor> levels;
    Capture capture(span_begin_, options_.sink_tokens, model_.attention_chunk(), &options_.windows,
                    false);
    capture.attend_whole(in, scratch, &levels);
    for (auto& [w, t] : levels) site.levels[w].push_back(t);
  }
  return site;
}

}  // namespace headwise::calib

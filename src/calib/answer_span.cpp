// The answer-span measure. See answer_span.hpp.
#include "headwise/calib/answer_span.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "answer_positions.hpp"
#include "finite_checks.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/exact_sum.hpp"
#include "headwise/core/units.hpp"
#include "span_attention.hpp"

namespace headwise::calib {

// What the positions before P leave for one layer, for one micro-batch.
struct AnswerSpan::LayerCache {
  KeyBlock keys;  // attention layers: the keys and values before P the span's queries may see
  arch::LayerState state;  // stateful layers: their states at P

  int64_t bytes() const {
    int64_t total = keys.k.defined() ? static_cast<int64_t>(keys.k.nbytes() + keys.v.nbytes()) : 0;
    for (const auto& [name, t] : state) total += static_cast<int64_t>(t.nbytes());
    return total;
  }
};

namespace {

// A candidate batch never runs more span rows than this through one layer call: the layers'
// intermediates (MLP, MoE, the delta rule's chunks) stay a few hundred MB at the largest widths.
constexpr int64_t kRowsPerCall = 8192;

bool stateful(const arch::LayerSpec& layer) {
  return !layer.states.empty();
}

int64_t layer_window(const arch::AttentionInputs& in) {
  return in.sliding_window > 0 ? in.sliding_window : kFullWindow;
}

SpanAttentionShape shape_of(const arch::AttentionInputs& in, int64_t window, int64_t sinks) {
  return {in.scaling, in.logit_softcap, in.sink_logits, window, window == kFullWindow ? 0 : sinks};
}

// Each tensor of `state` repeated `times` along the batch, every sequence's copies together (the
// candidates' row order, b * C + c); always a copy, as the layer writes its final state into it.
arch::LayerState repeated(const arch::LayerState& state, int64_t times) {
  arch::LayerState out;
  for (const auto& [name, t] : state) out[name] = t.repeat_interleave(times, 0);
  return out;
}

// The layers above the measured one: the span's queries against the layer's cache and their own
// keys.
class CachedSpanCore final : public arch::AttentionCore {
 public:
  explicit CachedSpanCore(const KeyBlock& cache) : cache_(cache) {}
  at::Tensor attend(const arch::AttentionInputs& in) override {
    const KeyBlock own{in.k, in.v, in.position_offset};
    return span_attention(in.q, in.position_offset, cache_, &own,
                          shape_of(in, layer_window(in), 0));
  }

 private:
  const KeyBlock& cache_;
};

// A global layer above the measured one under a policy: each head's span queries see, of the
// cache and their own keys, what its window reaches (and the sinks).
class WindowedCachedSpanCore final : public arch::AttentionCore {
 public:
  WindowedCachedSpanCore(const KeyBlock& cache, const std::vector<int64_t>& windows, int64_t sinks)
      : cache_(cache), windows_(windows), sinks_(sinks) {}
  at::Tensor attend(const arch::AttentionInputs& in) override {
    const KeyBlock own{in.k, in.v, in.position_offset};
    std::map<int64_t, at::Tensor> by_window;
    return compose_heads(windows_, [&](int64_t window) -> at::Tensor {
      auto it = by_window.find(window);
      if (it == by_window.end()) {
        const int64_t seen = std::min(window, layer_window(in));
        it = by_window
                 .emplace(window, span_attention(in.q, in.position_offset, cache_, &own,
                                                 shape_of(in, seen, sinks_)))
                 .first;
      }
      return it->second;
    });
  }

 private:
  const KeyBlock& cache_;
  const std::vector<int64_t>& windows_;
  int64_t sinks_;
};

// The measured layer: its attention output at the span is the candidates'.
class InjectedCore final : public arch::AttentionCore {
 public:
  explicit InjectedCore(at::Tensor output) : output_(std::move(output)) {}
  at::Tensor attend(const arch::AttentionInputs& in) override {
    HEADWISE_CHECK(output_.size(0) == in.q.size(0) && output_.size(1) == in.q.size(2) &&
                       output_.size(2) == in.q.size(1),
                   "answer span: candidate output {} for queries {}",
                   arch::shape_string(output_.sizes()), arch::shape_string(in.q.sizes()));
    return output_.to(in.q.scalar_type());
  }

 private:
  at::Tensor output_;
};

// Candidate outputs [Bm, S, heads, hd] each → [Bm * C, S, heads, hd], b-major.
at::Tensor interleave_candidates(const std::vector<const at::Tensor*>& outputs) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor* t : outputs) parts.push_back(*t);
  const at::Tensor stacked = at::stack(parts, 1);  // [Bm, C, S, heads, hd]
  return stacked.reshape(
      {stacked.size(0) * stacked.size(1), stacked.size(2), stacked.size(3), stacked.size(4)});
}

}  // namespace

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

std::vector<double> AnswerSpan::evaluate(const SpanSite& site,
                                         const std::vector<SpanOutputs>& candidates,
                                         const std::string& what) {
  return sweep({{&site, candidates}}, what).front();
}

// Every batch whose site lies below layer j runs layer j against the same cache whatever its
// layer or candidates: the batches of one micro-batch run as one call (their candidates side by
// side, b-major), up to kRowsPerCall span rows, so the calls per layer do not grow with the number
// of sites below it.
void AnswerSpan::run_above_sites(int64_t j, std::vector<SpanBatch>& batches,
                                 const std::vector<SweepItem>& items) {
  const auto micro_batches = micro_batch_rows_.size();
  for (size_t m = 0; m < micro_batches; ++m) {
    const int64_t rows = micro_batch_rows_[m];
    const int64_t max_count =
        std::max<int64_t>(1, kRowsPerCall / std::max<int64_t>(1, rows * span_length_));
    std::vector<SpanBatch*> group;
    int64_t count = 0;
    auto flush = [&] {
      if (group.empty()) return;
      std::vector<at::Tensor> parts;
      for (SpanBatch* b : group)
        parts.push_back(b->hidden.view({rows, -1, b->hidden.size(1), b->hidden.size(2)}));
      const at::Tensor merged = at::cat(parts, 1).view({rows * count, span_length_, -1});
      const LayerCache& cache = caches_[static_cast<size_t>(j)][m];
      CachedSpanCore core(cache.keys);
      arch::LayerState state = repeated(cache.state, count);
      const at::Tensor out =
          model_.run_layer(j, merged, {&core, state.empty() ? nullptr : &state, span_begin_})
              .view({rows, count, span_length_, -1});
      int64_t c0 = 0;
      for (SpanBatch* b : group) {
        const auto c = static_cast<int64_t>(b->c1 - b->c0);
        b->hidden = out.narrow(1, c0, c).reshape({rows * c, span_length_, -1});
        c0 += c;
      }
      candidate_layer_passes_ += count;
      group.clear();
      count = 0;
    };
    for (SpanBatch& b : batches) {
      const SweepItem& item = items[b.item];
      if (b.micro_batch != m || item.site->layer >= j) continue;
      const bool under_windows = item.above != nullptr && item.above->contains(j);
      if (under_windows || b.rows != rows) {
        run_alone(j, b, under_windows ? &item.above->at(j) : nullptr);
        continue;
      }
      const auto c = static_cast<int64_t>(b.c1 - b.c0);
      if (count + c > max_count) flush();
      group.push_back(&b);
      count += c;
    }
    flush();
  }
}

namespace {

// The first `rows` sequences of a micro-batch's cache.
KeyBlock first_rows(const KeyBlock& keys, int64_t rows) {
  if (!keys.k.defined() || keys.k.size(0) == rows) return keys;
  return {keys.k.narrow(0, 0, rows), keys.v.narrow(0, 0, rows), keys.first_position};
}

arch::LayerState first_rows(const arch::LayerState& state, int64_t rows) {
  arch::LayerState out;
  for (const auto& [name, t] : state) out[name] = t.narrow(0, 0, rows);
  return out;
}

}  // namespace

void AnswerSpan::run_alone(int64_t j, SpanBatch& batch, const std::vector<int64_t>* windows) {
  const int64_t count = static_cast<int64_t>(batch.c1 - batch.c0);
  const LayerCache& cache = caches_[static_cast<size_t>(j)][batch.micro_batch];
  const KeyBlock keys = first_rows(cache.keys, batch.rows);
  std::optional<WindowedCachedSpanCore> windowed;
  std::optional<CachedSpanCore> plain;
  arch::AttentionCore* core = nullptr;
  if (windows != nullptr) {
    core = &windowed.emplace(keys, *windows, options_.sink_tokens);
  } else {
    core = &plain.emplace(keys);
  }
  arch::LayerState state = repeated(first_rows(cache.state, batch.rows), count);
  batch.hidden =
      model_.run_layer(j, batch.hidden, {core, state.empty() ? nullptr : &state, span_begin_});
  candidate_layer_passes_ += count;
}

std::vector<double> AnswerSpan::evaluate_policies(
    int64_t layer, ActivationStream& stream,
    const std::vector<std::map<int64_t, std::vector<int64_t>>>& policies, const std::string& what) {
  HEADWISE_CHECK(!policies.empty(), "answer span: {}: no policy to evaluate", what);
  const SpanSite site = capture(layer, stream);
  std::vector<SweepItem> items;
  for (const auto& policy : policies) {
    const auto windows = policy.find(layer);
    HEADWISE_CHECK(windows != policy.end(), "answer span: {}: a policy without layer {}", what,
                   layer);
    items.push_back({&site, {site.compose(windows->second)}, &policy});
  }
  std::vector<double> values;
  for (const auto& per_item : sweep(items, what)) values.push_back(per_item.front());
  return values;
}

std::vector<std::vector<double>> AnswerSpan::sweep(const std::vector<SweepItem>& items,
                                                   const std::string& what) {
  const auto& spec = model_.spec();
  const auto micro_batches = micro_batch_rows_.size();
  std::vector<SpanBatch> batches;
  int64_t lowest = spec.num_layers();
  for (size_t i = 0; i < items.size(); ++i) {
    const SweepItem& item = items[i];
    HEADWISE_CHECK(item.site != nullptr && item.site->input.size() == micro_batches,
                   "answer span: site without inputs");
    lowest = std::min(lowest, item.site->layer);
    int64_t first_row = 0;  // of micro-batch m among this rank's sequences
    for (size_t m = 0; m < micro_batches; ++m) {
      const int64_t all_rows = micro_batch_rows_[m];
      const int64_t used = item.sequences < 0
                               ? all_rows
                               : std::clamp<int64_t>(item.sequences - first_row, 0, all_rows);
      first_row += all_rows;
      if (used == 0) continue;
      const auto per_call = static_cast<size_t>(
          std::max<int64_t>(1, kRowsPerCall / std::max<int64_t>(1, used * span_length_)));
      for (size_t c0 = 0; c0 < item.candidates.size(); c0 += per_call) {
        batches.push_back({i, m, c0, std::min(item.candidates.size(), c0 + per_call), {}, used});
      }
    }
  }
  for (int64_t j = lowest; j < spec.num_layers(); ++j) {
    model_.prefetch_layer(j + 1);
    for (SpanBatch& b : batches) {
      const SweepItem& item = items[b.item];
      const auto count = static_cast<int64_t>(b.c1 - b.c0);
      if (item.site->layer == j) {
        std::vector<at::Tensor> outputs;
        for (size_t c = b.c0; c < b.c1; ++c) {
          HEADWISE_CHECK(item.candidates[c].size() == micro_batches,
                         "answer span: candidate without every micro-batch");
          outputs.push_back(item.candidates[c][b.micro_batch].narrow(0, 0, b.rows));
        }
        std::vector<const at::Tensor*> pointers;
        for (const at::Tensor& t : outputs) pointers.push_back(&t);
        InjectedCore core(interleave_candidates(pointers));
        arch::LayerState state =
            b.micro_batch < item.site->state.size()
                ? repeated(first_rows(item.site->state[b.micro_batch], b.rows), count)
                : arch::LayerState{};
        const at::Tensor input =
            item.site->input[b.micro_batch].narrow(0, 0, b.rows).repeat_interleave(count, 0);
        b.hidden =
            model_.run_layer(j, input, {&core, state.empty() ? nullptr : &state, span_begin_});
        candidate_layer_passes_ += count;
      }
    }
    run_above_sites(j, batches, items);
    // The measured (lowest) layer stays resident when it may: the walk runs it under its decision
    // next.
    if (j > lowest || !options_.keep_measured_layer) model_.release_layer(j);
  }
  std::vector<std::vector<ExactSum>> sums(items.size());
  std::vector<int64_t> answers_used(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) sums[i].resize(items[i].candidates.size());
  for (const SpanBatch& b : batches) {
    const auto count = static_cast<int64_t>(b.c1 - b.c0);
    const auto m = static_cast<size_t>(b.micro_batch);
    // The answers of the rows the batch measured (every one unless SweepItem::sequences).
    const bool every_row = b.rows == micro_batch_rows_[m];
    const at::Tensor kept = every_row ? at::Tensor() : answer_rows_[m] < b.rows;
    const at::Tensor answer_rows = every_row ? answer_rows_[m] : answer_rows_[m].index({kept});
    const at::Tensor answer_columns =
        every_row ? answer_columns_[m] : answer_columns_[m].index({kept});
    if (b.c0 == 0) answers_used[b.item] += answer_rows.size(0);
    if (answer_rows.size(0) == 0) continue;
    // Answer a of sequence r is row r * C + c of the batch.
    const at::Tensor rows =
        answer_rows.unsqueeze(1) * count + at::arange(count, answer_rows.options()).unsqueeze(0);
    const at::Tensor cols = (answer_columns - span_begin_).unsqueeze(1).expand_as(rows);
    const at::Tensor picked = b.hidden.index({rows.reshape(-1), cols.reshape(-1)}).unsqueeze(0);
    const at::Tensor log_q =
        at::log_softmax(model_.logits(picked).squeeze(0).to(at::kFloat), -1);  // [answers * C, V]
    const at::Tensor reference = every_row ? reference_[m] : reference_[m].index({kept});
    const at::Tensor log_p = reference.repeat_interleave(count, 0);
    const at::Tensor per = divergence_per_position(log_p, log_q, options_.divergence)
                               .to(at::kDouble)
                               .view({-1, count})
                               .cpu()
                               .contiguous();  // [answers, C]
    const double* d = per.data_ptr<double>();
    const int64_t n = per.size(0);
    for (int64_t c = 0; c < count; ++c) {
      ExactSum& sum = sums[b.item][b.c0 + static_cast<size_t>(c)];
      for (int64_t a = 0; a < n; ++a) sum.add(d[a * count + c]);
    }
  }
  std::vector<std::vector<double>> means(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    evaluations_ += static_cast<int64_t>(items[i].candidates.size());
    const auto merged = dist::sum_all(*world_, std::move(sums[i]), what);
    const int64_t answers = items[i].sequences < 0
                                ? answers_
                                : dist::sum_all(*world_, answers_used[i], what + ": answers");
    if (answers == 0) {
      throw_input_error("{}: the first {} calibration sequences have no answer positions", what,
                        items[i].sequences);
    }
    for (size_t c = 0; c < merged.size(); ++c) {
      const double mean = merged[c].value() / static_cast<double>(answers);
      if (!std::isfinite(mean)) {
        throw NumericError(
            fmt::format("{}: {} is NaN/Inf for candidate {} of layer {}: check the layer's weights",
                        what, divergence_label(options_.divergence), c, items[i].site->layer));
      }
      means[i].push_back(mean);
    }
  }
  return means;
}

double AnswerSpan::evaluate_final(ActivationStream& final_hidden) {
  ExactSum total;
  int64_t m = 0;
  final_hidden.visit([&](const at::Tensor& hidden) {
    const at::Tensor log_q = log_probs_at_answers(m, hidden, 0);
    total.add(
        divergence_per_position(reference_[static_cast<size_t>(m)], log_q, options_.divergence)
            .to(at::kDouble)
            .sum()
            .item<double>());
    ++m;
  });
  return dist::sum_all(*world_, total, "the walk's end-to-end answer divergence").value() /
         static_cast<double>(answers_);
}

}  // namespace headwise::calib

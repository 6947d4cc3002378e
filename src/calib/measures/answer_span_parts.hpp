#pragma once
// The answer-span measure's internal parts, shared by its reference pass and sites
// (answer_span.cpp) and its evaluations and sweeps (answer_span_sweep.cpp): what a layer's cache
// holds, and the attention cores through which the span's rows run the layers above.
#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <vector>

#include "calib/measures/span_attention.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/window.hpp"

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

namespace answer_span_parts {

// A candidate batch never runs more span rows than this through one layer call: the layers'
// intermediates (MLP, MoE, the delta rule's chunks) stay a few hundred MB at the largest widths.
constexpr int64_t kRowsPerCall = 8192;

inline bool stateful(const arch::LayerSpec& layer) {
  return !layer.states.empty();
}

inline int64_t layer_window(const arch::AttentionInputs& in) {
  return in.sliding_window > 0 ? in.sliding_window : kFullWindow;
}

inline SpanAttentionShape shape_of(const arch::AttentionInputs& in, int64_t window, int64_t sinks) {
  return {in.scaling, in.logit_softcap, in.sink_logits, window, window == kFullWindow ? 0 : sinks};
}

// Each tensor of `state` repeated `times` along the batch, every sequence's copies together (the
// candidates' row order, b * C + c); always a copy, as the layer writes its final state into it.
inline arch::LayerState repeated(const arch::LayerState& state, int64_t times) {
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
inline at::Tensor interleave_candidates(const std::vector<const at::Tensor*>& outputs) {
  std::vector<at::Tensor> parts;
  for (const at::Tensor* t : outputs) parts.push_back(*t);
  const at::Tensor stacked = at::stack(parts, 1);  // [Bm, C, S, heads, hd]
  return stacked.reshape(
      {stacked.size(0) * stacked.size(1), stacked.size(2), stacked.size(3), stacked.size(4)});
}

}  // namespace answer_span_parts
}  // namespace headwise::calib

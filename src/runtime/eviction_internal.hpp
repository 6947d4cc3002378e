#pragma once
// What the eviction core's two files share (eviction_attention.cpp: attention and the SnapKV /
// H2O / AdaKV updates; snap_attention.cpp: the snap keep rule's staging and choice). Internal to
// src/runtime, not an API.
#include <ATen/ATen.h>

#include <cstdint>
#include <limits>

#include "headwise/core/error.hpp"
#include "headwise/runtime/eviction_cache.hpp"

namespace headwise::runtime::detail {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Keys a head attends over, with what decides their fate.
struct Entries {
  at::Tensor k, v;      // [n, head_dim] in the activation dtype
  at::Tensor position;  // [n] int64
  at::Tensor score;     // [n] float32 keep priority
};

inline Entries concat(const Entries& a, const Entries& b) {
  return {at::cat({a.k, b.k}), at::cat({a.v, b.v}), at::cat({a.position, b.position}),
          at::cat({a.score, b.score})};
}

inline Entries select(const Entries& e, const at::Tensor& idx) {
  return {e.k.index_select(0, idx), e.v.index_select(0, idx), e.position.index_select(0, idx),
          e.score.index_select(0, idx)};
}

inline Entries held_entries(const EvictionLayer& l, int64_t b, int64_t h, at::ScalarType dtype) {
  const auto bi = static_cast<size_t>(b), hi = static_cast<size_t>(h);
  const int64_t off = l.offset[bi][hi], n = l.held[bi][hi];
  return {l.k[b].narrow(0, off, n).to(dtype), l.v[b].narrow(0, off, n).to(dtype),
          l.position[b].narrow(0, off, n), l.score[b].narrow(0, off, n)};
}

// Rewrites a head's region with `e` (at most the region's length), ascending by position.
inline void write_region(EvictionLayer& l, int64_t b, int64_t h, const Entries& e) {
  const auto bi = static_cast<size_t>(b), hi = static_cast<size_t>(h);
  const int64_t off = l.offset[bi][hi], len = l.length[bi][hi], n = e.k.size(0);
  HEADWISE_CHECK(n <= len, "layer {} head {}: {} entries for a region of {} slots", l.layer_id, h,
                 n, len);
  l.k[b].narrow(0, off, n).copy_(e.k);
  l.v[b].narrow(0, off, n).copy_(e.v);
  l.position[b].narrow(0, off, n).copy_(e.position);
  l.score[b].narrow(0, off, n).copy_(e.score);
  l.position[b].narrow(0, off + n, len - n).fill_(-1);
  l.score[b].narrow(0, off + n, len - n).zero_();
  l.held[bi][hi] = n;
}

// How a head's held keys are shown to its queries: what an evicting head holds was chosen by
// eviction, so among it only causality limits a query (a full window); a window head shows
// exactly its window and sinks.
struct Visibility {
  int64_t window = kFullWindow;
  int64_t sinks = 0;
};

// What one attend() call works on.
struct Step {
  const arch::AttentionInputs& in;
  at::Tensor q;      // [B, kv_heads, group, T, hd]
  at::Tensor new_k;  // [B, kv_heads, T, hd] through the cache dtype, in the activation dtype
  at::Tensor new_v;
  int64_t first = 0;  // position of the step's first token
  int64_t steps = 0;
  at::Tensor sink_logits(int64_t h) const {
    return in.sink_logits.defined() ? in.sink_logits.view({q.size(1), q.size(2)})[h] : at::Tensor();
  }
};

// Softmax probabilities [g, t, n] (fp32) of queries q [g, t, hd] at positions q_begin.. over
// `keys`, causal, all of them visible (eviction_attention.cpp's attention_probs).
at::Tensor observation_probs(const at::Tensor& q, int64_t q_begin, const Entries& keys,
                             const arch::AttentionInputs& in, const at::Tensor& sink_logits);

// The snap heads (snap_attention.cpp).
void stage_snap(EvictionLayer& l, const Step& s, at::ScalarType kv_dtype);
Entries snap_candidates(const EvictionLayer& l, int64_t b, int64_t h, at::ScalarType dtype);
void observe_snap(EvictionLayer& l, const Step& s, int64_t b, int64_t h, const Entries& keys,
                  int64_t observed_begin);
void compress_snap(EvictionLayer& l, int64_t observed_begin, int64_t prompt_end,
                   const EvictionOptions& o);

}  // namespace headwise::runtime::detail

// The snap keep rule in the eviction cache (eviction_cache.hpp, EvictionOptions::snap_heads;
// docs/keep-rules.md): a snap head stages the prompt and scores each key by the observation
// window's queries as chunks arrive, then keeps the best at the prompt's end.
#include <algorithm>

#include "eviction_internal.hpp"

namespace headwise::runtime {
namespace detail {

// The snap heads' K/V of this chunk join the layer's staged prompt [B, snap heads, n, hd].
void stage_snap(EvictionLayer& l, const Step& s, at::ScalarType kv_dtype) {
  std::vector<int64_t> heads;
  for (int64_t h = 0; h < l.num_kv_heads; ++h) {
    if (l.snap_index[static_cast<size_t>(h)] >= 0) heads.push_back(h);
  }
  const at::Tensor idx =
      at::tensor(heads, at::TensorOptions().dtype(at::kLong)).to(s.new_k.device());
  const at::Tensor k = s.new_k.index_select(1, idx).to(kv_dtype);
  const at::Tensor v = s.new_v.index_select(1, idx).to(kv_dtype);
  if (!l.staged_k.defined()) {
    l.staged_begin = s.first;
    l.staged_k = k;
    l.staged_v = v;
    return;
  }
  HEADWISE_CHECK(l.staged_begin + l.staged_k.size(2) == s.first,
                 "layer {}: snap heads staged up to {}, chunk at {}", l.layer_id,
                 l.staged_begin + l.staged_k.size(2), s.first);
  l.staged_k = at::cat({l.staged_k, k}, 2);
  l.staged_v = at::cat({l.staged_v, v}, 2);
}

// A snap head's candidates: what it held before the prompt, then the staged prompt.
Entries snap_candidates(const EvictionLayer& l, int64_t b, int64_t h, at::ScalarType dtype) {
  const int64_t j = l.snap_index[static_cast<size_t>(h)], n = l.staged_k.size(2);
  const Entries staged{l.staged_k[b][j].to(dtype), l.staged_v[b][j].to(dtype),
                       at::arange(l.staged_begin, l.staged_begin + n, l.position.options()),
                       at::zeros({n}, l.score.options())};
  return concat(held_entries(l, b, h, dtype), staged);
}

// Adds what the observation queries among this chunk's (positions >= observed_begin) give each of
// snap head h's candidates `keys`, summed over those queries and the head's query heads, to the
// head's running score (grown to the candidates with zeros: a key after a query gets nothing).
void observe_snap(EvictionLayer& l, const Step& s, int64_t b, int64_t h, const Entries& keys,
                  int64_t observed_begin) {
  at::Tensor& r = l.snap_received[static_cast<size_t>(b)]
                                 [static_cast<size_t>(l.snap_index[static_cast<size_t>(h)])];
  const int64_t n = keys.k.size(0), have = r.defined() ? r.size(0) : 0;
  const at::Tensor grown = at::zeros({n - have}, keys.score.options());
  r = r.defined() ? at::cat({r, grown}) : grown;
  const int64_t from = std::max(observed_begin, s.first), to = s.first + s.steps;
  if (from >= to) return;
  r = r + observation_probs(s.q[b][h].slice(1, from - s.first, to - s.first), from, keys, s.in,
                            s.sink_logits(h))
              .sum(at::IntArrayRef{0, 1});
}

// The prompt [.., prompt_end) is in: every snap head of the layer keeps its observation window
// [observed_begin, prompt_end) and its best prefix keys by pooled score (snap_keep_indices), and
// the staging is dropped.
void compress_snap(EvictionLayer& l, int64_t observed_begin, int64_t prompt_end,
                   const EvictionOptions& o) {
  if (l.num_snap_heads == 0 || !l.staged_k.defined()) return;
  const auto kv_dtype = l.k.scalar_type();
  const int64_t batch = static_cast<int64_t>(l.held.size());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < l.num_kv_heads; ++h) {
      const int64_t j = l.snap_index[static_cast<size_t>(h)];
      if (j < 0) continue;
      Entries c = snap_candidates(l, b, h, kv_dtype);
      const int64_t n = c.k.size(0);
      at::Tensor raw = l.snap_received[static_cast<size_t>(b)][static_cast<size_t>(j)];
      if (!raw.defined()) raw = at::zeros({0}, c.score.options());
      if (raw.size(0) < n) raw = at::cat({raw, at::zeros({n - raw.size(0)}, raw.options())});
      const int64_t prefix = (c.position < observed_begin).sum().item<int64_t>();
      const at::Tensor pooled = pool_scores(raw.slice(0, 0, prefix), o.pooling_kernel, o.pooling);
      const at::Tensor window = c.position.slice(0, prefix);
      const at::Tensor primary = at::cat({pooled, at::full({n - prefix}, kInf, pooled.options())});
      // In the observation window (all +inf) the more recent positions win.
      const at::Tensor secondary = at::cat({raw.slice(0, 0, prefix), window.to(at::kFloat)});
      const bool ring = o.snap_decode == SnapDecode::kRecentRing;
      c.score = at::cat({pooled, at::full({n - prefix}, ring ? -kInf : kInf, pooled.options())});
      const int64_t keep = l.length[static_cast<size_t>(b)][static_cast<size_t>(h)];
      write_region(l, b, h, select(c, snap_keep_indices(c.position, primary, secondary, keep)));
    }
  }
  l.snap_ring = prompt_end - observed_begin;
  drop_staging(l);
}

}  // namespace detail

void EvictionAttentionCore::end_prompt_layer(int64_t layer_id) {
  const EvictionOptions& eo = cache_.eviction();
  detail::compress_snap(cache_.layer(layer_id),
                        std::max(prompt_begin_, prompt_end_ - eo.observation_window), prompt_end_,
                        eo);
}

void EvictionAttentionCore::end_prompt() {
  for (auto& [id, l] : cache_.layers()) {
    if (l.num_snap_heads > 0) end_prompt_layer(id);
  }
}

}  // namespace headwise::runtime

// EvictionAttentionCore: attention over what each KV head of an EvictionCache holds, and the
// SnapKV / H2O / AdaKV updates after it. See eviction_cache.hpp for the rules.
//
// Each (sequence, KV head) is handled on its own: heads hold different tokens (and under AdaKV
// different counts), so there is no shared key axis to batch over. Scores are computed one query
// chunk at a time over at most (held + staged or new) keys: never a T x T matrix.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "eviction_internal.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"
#include "headwise/runtime/eviction_cache.hpp"

namespace headwise::runtime {
using namespace detail;
namespace {

// Which held keys queries at positions q_begin..q_begin+t may see [t, n].
at::Tensor visible(int64_t q_begin, int64_t t, const Entries& keys, Visibility shown) {
  return arch::visible_keys(at::arange(q_begin, q_begin + t, keys.position.options()),
                            keys.position, shown.window, shown.sinks);
}

// Softmax probabilities [g, t, n] (fp32) of queries q [g, t, hd] at positions q_begin.. over
// `keys`, causal. Numerics as the grouped cache's attention: scores in the activation dtype,
// softmax in fp32; a gpt-oss sink logit per query head joins the softmax and is dropped.
at::Tensor attention_probs(const at::Tensor& q, int64_t q_begin, const Entries& keys,
                           const arch::AttentionInputs& in, const at::Tensor& sink_logits,
                           Visibility shown = {}) {
  const int64_t g = q.size(0), t = q.size(1);
  at::Tensor scores;
  {
    // One [g*t, hd] x [hd, n] product: small at H2O's slot counts, so pinned
    // (reproducible_math.hpp).
    const SmallGemmOnOneThread pinned(g * t, keys.k.size(0), q.is_cpu());
    scores = at::matmul(q, keys.k.transpose(0, 1)) * in.scaling;  // [g, t, n]
  }
  if (in.logit_softcap > 0) scores = at::tanh(scores / in.logit_softcap) * in.logit_softcap;
  const at::Tensor logits =
      scores.to(at::kFloat).masked_fill(visible(q_begin, t, keys, shown).logical_not(), -kInf);
  return arch::softmax_with_sink_logit(
      logits, sink_logits.defined() ? sink_logits.view({g, 1, 1}) : at::Tensor());
}

// Attention output [g, t, hd] of one KV head's queries, `chunk` queries at a time; when
// `received` is given, the probability each key got, summed over queries and query heads (H2O).
// Without it (and without sink logits or soft-capping) the fused kernel needs no probabilities.
at::Tensor attend_head(const at::Tensor& q, int64_t q_begin, const Entries& keys,
                       const arch::AttentionInputs& in, const at::Tensor& sink_logits,
                       int64_t chunk, at::Tensor* received, arch::AttentionKernel kernel,
                       Visibility shown) {
  const int64_t g = q.size(0), t = q.size(1), n = keys.k.size(0), hd = q.size(2);
  const bool fused = kernel == arch::AttentionKernel::kFused && received == nullptr &&
                     !sink_logits.defined() && in.logit_softcap <= 0;
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (received != nullptr) *received = at::zeros({keys.k.size(0)}, keys.score.options());
  for (int64_t t0 = 0; t0 < t; t0 += chunk) {
    const int64_t t1 = std::min(t, t0 + chunk);
    if (fused) {
      const at::Tensor allowed = visible(q_begin + t0, t1 - t0, keys, shown);
      out.slice(1, t0, t1).copy_(
          arch::fused_masked_attention(q.slice(1, t0, t1).unsqueeze(0), keys.k.view({1, 1, n, hd}),
                                       keys.v.view({1, 1, n, hd}), allowed, in.scaling)
              .reshape({g, t1 - t0, hd}));
      continue;
    }
    const at::Tensor probs =
        attention_probs(q.slice(1, t0, t1), q_begin + t0, keys, in, sink_logits, shown);
    const SmallGemmOnOneThread pinned(g * (t1 - t0), hd, q.is_cpu());
    out.slice(1, t0, t1).copy_(at::matmul(probs.to(keys.v.scalar_type()), keys.v));
    if (received != nullptr) *received += probs.sum(at::IntArrayRef{0, 1});
  }
  return out;
}

// SnapKV's score for every candidate: the observation queries' probabilities (summed over them
// and the query heads) pooled along positions over the prefix; the observation window itself
// scores +inf (always kept, and last to go). Candidates are ascending by position.
at::Tensor snapkv_scores(const at::Tensor& observed_q, int64_t observed_begin,
                         const Entries& candidates, const arch::AttentionInputs& in,
                         const at::Tensor& sink_logits, const EvictionOptions& o) {
  const at::Tensor received =
      attention_probs(observed_q, observed_begin, candidates, in, sink_logits)
          .sum(at::IntArrayRef{0, 1});
  const int64_t prefix = (candidates.position < observed_begin).sum().item<int64_t>();
  const at::Tensor pooled = pool_scores(received.slice(0, 0, prefix), o.pooling_kernel, o.pooling);
  return at::cat({pooled, at::full({candidates.k.size(0) - prefix}, kInf, received.options())});
}

// Splits `total` slots evenly over `heads` (the first heads take the remainder).
std::vector<int64_t> even_split(int64_t total, int64_t heads) {
  std::vector<int64_t> out(static_cast<size_t>(heads), total / heads);
  for (int64_t h = 0; h < total % heads; ++h) ++out[static_cast<size_t>(h)];
  return out;
}

}  // namespace

at::Tensor detail::observation_probs(const at::Tensor& q, int64_t q_begin, const Entries& keys,
                                     const arch::AttentionInputs& in,
                                     const at::Tensor& sink_logits) {
  return attention_probs(q, q_begin, keys, in, sink_logits);
}

void EvictionAttentionCore::begin_prompt(int64_t begin, int64_t end) {
  HEADWISE_CHECK(0 <= begin && begin < end, "prompt [{}, {})", begin, end);
  forget_prompt();
  prompt_begin_ = begin;
  prompt_end_ = end;
}

void EvictionAttentionCore::forget_prompt() {
  // A prompt left half-staged (an interrupted prefill) must not leak into the next one.
  for (auto& [id, l] : cache_.layers()) drop_staging(l);
  prompt_begin_ = prompt_end_ = 0;
}

namespace {

// Appends this chunk to the layer's staged prompt, and the observation window's queries.
void stage(EvictionLayer& l, const Step& s, at::ScalarType kv_dtype, int64_t observed_begin) {
  if (!l.staged_k.defined()) {
    l.staged_begin = s.first;
    l.staged_k = s.new_k.to(kv_dtype);
    l.staged_v = s.new_v.to(kv_dtype);
  } else {
    HEADWISE_CHECK(l.staged_begin + l.staged_k.size(2) == s.first,
                   "layer {}: staged up to {}, chunk at {}", l.layer_id,
                   l.staged_begin + l.staged_k.size(2), s.first);
    l.staged_k = at::cat({l.staged_k, s.new_k.to(kv_dtype)}, 2);
    l.staged_v = at::cat({l.staged_v, s.new_v.to(kv_dtype)}, 2);
  }
  const int64_t from = std::max(observed_begin, s.first), to = s.first + s.steps;
  if (from >= to) return;
  const at::Tensor q = s.q.slice(3, from - s.first, to - s.first);
  l.observed_q = l.observed_q.defined() ? at::cat({l.observed_q, q}, 3) : q.clone();
}

Entries staged_entries(const EvictionLayer& l, int64_t b, int64_t h, at::ScalarType dtype) {
  const int64_t n = l.staged_k.size(2);
  return {l.staged_k[b][h].to(dtype), l.staged_v[b][h].to(dtype),
          at::arange(l.staged_begin, l.staged_begin + n, l.position.options()),
          at::zeros({n}, l.score.options())};
}

Entries new_entries(const Step& s, const EvictionLayer& l, int64_t b, int64_t h) {
  return {s.new_k[b][h], s.new_v[b][h],
          at::arange(s.first, s.first + s.steps, l.position.options()),
          at::zeros({s.steps}, l.score.options())};
}

// SnapKV at a prompt's end: each head keeps its observation window and the best prefix keys.
// `observed_q` [B, kv_heads, group, m, hd]: the observation window's queries.
void compress_snapkv(EvictionLayer& l, const Step& s, int64_t b,
                     const std::vector<Entries>& candidates, const at::Tensor& observed_q,
                     int64_t observed_begin, const EvictionOptions& o) {
  for (int64_t h = 0; h < l.num_kv_heads; ++h) {
    Entries c = candidates[static_cast<size_t>(h)];
    c.score = snapkv_scores(observed_q[b][h], observed_begin, c, s.in, s.sink_logits(h), o);
    write_region(
        l, b, h,
        select(c, keep_indices(c.position, c.score,
                               l.length[static_cast<size_t>(b)][static_cast<size_t>(h)], 0)));
  }
}

// AdaKV at a prompt's end: the layer's slots are re-divided among its heads — every head keeps
// the observation window, the prefix budget goes by AdaKV's flattened selection.
void compress_adakv(EvictionLayer& l, const Step& s, int64_t b, std::vector<Entries> candidates,
                    const at::Tensor& observed_q, int64_t observed_begin,
                    const EvictionOptions& o) {
  const auto bi = static_cast<size_t>(b);
  const int64_t heads = l.num_kv_heads;
  const int64_t total = std::accumulate(l.length[bi].begin(), l.length[bi].end(), int64_t{0});
  // A budget too small for every head's window keeps each head's most recent share of it.
  const int64_t observed = s.first + s.steps - observed_begin;
  const int64_t window = std::min(observed, total / heads);
  const int64_t prefix_total = total - heads * window;
  std::vector<at::Tensor> scores, positions;
  for (int64_t h = 0; h < heads; ++h) {
    Entries& c = candidates[static_cast<size_t>(h)];
    c.score = snapkv_scores(observed_q[b][h], observed_begin, c, s.in, s.sink_logits(h), o);
    const int64_t prefix = (c.position < observed_begin).sum().item<int64_t>();
    scores.push_back(c.score.slice(0, 0, prefix));
    positions.push_back(c.position.slice(0, 0, prefix));
  }
  const auto floor = static_cast<int64_t>(
      std::floor(o.adakv_floor * static_cast<double>(prefix_total) / static_cast<double>(heads)));
  const std::vector<int64_t> budget = adakv_budgets(scores, positions, prefix_total, floor);
  // Slots no candidate needs (a prompt shorter than the budget) stay free for decoding, evenly.
  const int64_t used = std::accumulate(budget.begin(), budget.end(), int64_t{0});
  const std::vector<int64_t> spare = even_split(prefix_total - used, heads);
  int64_t offset = 0;
  for (int64_t h = 0; h < heads; ++h) {
    const auto hi = static_cast<size_t>(h);
    const int64_t keep = window + budget[hi];
    l.offset[bi][hi] = offset;
    l.length[bi][hi] = keep + spare[hi];
    offset += l.length[bi][hi];
    const Entries& c = candidates[hi];
    write_region(l, b, h, select(c, keep_indices(c.position, c.score, keep, 0)));
  }
  HEADWISE_CHECK(offset == total, "AdaKV regions {} != the layer's {} slots", offset, total);
}

// After attending (not staging): the new tokens join the head, evicting down to its region.
// A window head keeps its sinks (scored +inf) and the most recent tokens; H2O keeps half the
// region for the most recent tokens; SnapKV/AdaKV score new tokens +inf, so the lowest-scored
// prefix key makes room.
void insert(EvictionLayer& l, int64_t b, int64_t h, const Entries& held_and_new,
            const at::Tensor& received, const EvictionOptions& o, int64_t sinks) {
  const EvictionMethod method = o.method;
  Entries e = held_and_new;
  const int64_t held = l.held[static_cast<size_t>(b)][static_cast<size_t>(h)];
  const int64_t length = l.length[static_cast<size_t>(b)][static_cast<size_t>(h)];
  if (l.snap_index[static_cast<size_t>(h)] >= 0) {
    // A snap head: the ring's tokens score -inf (the selected prefix keys outrank them, the ring
    // keeps the most recent), or new tokens score +inf (the lowest-scored prefix key goes).
    const bool ring = o.snap_decode == SnapDecode::kRecentRing;
    e.score = at::cat({e.score.slice(0, 0, held),
                       at::full({e.k.size(0) - held}, ring ? -kInf : kInf, e.score.options())});
    const int64_t recent = ring ? std::min(l.snap_ring, length) : 0;
    write_region(l, b, h, select(e, keep_indices(e.position, e.score, length, recent)));
    return;
  }
  if (l.window[static_cast<size_t>(h)] > 0) {
    e.score = at::zeros_like(e.score).masked_fill(e.position < sinks, kInf);
    write_region(
        l, b, h,
        select(e, keep_indices(e.position, e.score, length, length - std::min(sinks, length))));
    return;
  }
  if (method == EvictionMethod::kH2O) {
    e.score = e.score + received;  // new entries start at 0
  } else {
    e.score = at::cat(
        {e.score.slice(0, 0, held), at::full({e.k.size(0) - held}, kInf, e.score.options())});
  }
  const int64_t recent = method == EvictionMethod::kH2O ? length / 2 : 0;
  write_region(l, b, h, select(e, keep_indices(e.position, e.score, length, recent)));
}

}  // namespace

at::Tensor EvictionAttentionCore::attend(const arch::AttentionInputs& in) {
  const int64_t batch = in.q.size(0), num_heads = in.q.size(1), steps = in.q.size(2),
                head_dim = in.q.size(3);
  const int64_t num_kv = in.k.size(1), first = in.position_offset;
  HEADWISE_CHECK(in.sliding_window == 0,
                 "layer {} is sliding: the eviction cache serves global layers only", in.layer_id);
  HEADWISE_CHECK(num_heads % num_kv == 0 && in.k.size(2) == steps, "attention shapes q {} k {}",
                 arch::shape_string(in.q.sizes()), arch::shape_string(in.k.sizes()));
  const auto& o = cache_.options();
  HEADWISE_CHECK(batch == o.batch, "batch {} but the cache holds {} sequences", batch, o.batch);
  HEADWISE_CHECK(first + steps <= o.context, "positions up to {} exceed the cache context {}",
                 first + steps, o.context);
  EvictionLayer& l = cache_.layer(in.layer_id);
  HEADWISE_CHECK(l.num_kv_heads == num_kv, "layer {}: {} KV heads, the cache has {}", in.layer_id,
                 num_kv, l.num_kv_heads);
  const EvictionOptions& eo = cache_.eviction();
  const auto dtype = in.q.scalar_type(), kv_dtype = l.k.scalar_type();
  // New keys pass through the cache dtype: every key a query sees went through the same storage.
  const auto through_cache = [&](const at::Tensor& t) {
    return kv_dtype == dtype ? t : t.to(kv_dtype).to(dtype);
  };
  const Step s{in,
               in.q.reshape({batch, num_kv, num_heads / num_kv, steps, head_dim}),
               through_cache(in.k),
               through_cache(in.v),
               first,
               steps};

  // SnapKV/AdaKV see the whole prompt before choosing: stage it, compress at its last chunk.
  // Chunked, each prefill chunk is a prompt of its own, with nothing to stage: its queries see
  // the held keys plus its own (as H2O's), then its last queries observe and the rule compresses.
  const bool in_prompt =
      eo.method != EvictionMethod::kH2O && first >= prompt_begin_ && first + steps <= prompt_end_;
  const bool each_chunk = eo.prefill == EvictionPrefill::kEachChunk;
  const bool staging = in_prompt && !each_chunk;
  const int64_t segment_end = each_chunk ? first + steps : prompt_end_;
  const int64_t observed_begin =
      std::max(each_chunk ? first : prompt_begin_, segment_end - eo.observation_window);
  if (staging) {
    stage(l, s, kv_dtype, observed_begin);
    cache_.note_staged();
  }
  // Snap heads stage the prompt (K/V and a score per key) until end_prompt; a step past the
  // prompt with the layer still staging (end_prompt not called) compresses first.
  const bool snap_prompt = l.num_snap_heads > 0 && prompt_end_ > prompt_begin_ &&
                           first >= prompt_begin_ && first + steps <= prompt_end_;
  if (l.num_snap_heads > 0 && !snap_prompt && l.staged_k.defined()) end_prompt_layer(l.layer_id);
  const int64_t snap_observed_begin = std::max(prompt_begin_, prompt_end_ - eo.observation_window);
  if (snap_prompt) stage_snap(l, s, kv_dtype);
  const bool compress = in_prompt && first + steps == segment_end;
  const at::Tensor observed_q = !compress ? at::Tensor()
                                : staging ? l.observed_q
                                          : s.q.slice(3, observed_begin - first, steps);

  at::Tensor out = at::empty(s.q.sizes(), s.q.options());
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Entries> candidates;
    for (int64_t h = 0; h < num_kv; ++h) {
      const bool snap = l.snap_index[static_cast<size_t>(h)] >= 0;
      if (snap && snap_prompt) {
        // Every prompt key so far is visible (as full KV), and the observation queries score them.
        const Entries keys = snap_candidates(l, b, h, dtype);
        out[b][h].copy_(attend_head(s.q[b][h], first, keys, in, s.sink_logits(h), query_chunk_,
                                    nullptr, kernel_, Visibility{}));
        observe_snap(l, s, b, h, keys, snap_observed_begin);
        continue;
      }
      const Entries keys =
          concat(held_entries(l, b, h, dtype),
                 staging ? staged_entries(l, b, h, dtype) : new_entries(s, l, b, h));
      at::Tensor received;
      const int64_t window = l.window[static_cast<size_t>(h)];
      const bool accumulate =
          !in_prompt && eo.method == EvictionMethod::kH2O && window == 0 && !snap;
      const Visibility shown = window > 0 ? Visibility{window, o.sink_tokens} : Visibility{};
      out[b][h].copy_(attend_head(s.q[b][h], first, keys, in, s.sink_logits(h), query_chunk_,
                                  accumulate ? &received : nullptr, kernel_, shown));
      if (!in_prompt) insert(l, b, h, keys, received, eo, o.sink_tokens);
      if (compress) candidates.push_back(keys);
    }
    if (!compress) continue;
    if (eo.method == EvictionMethod::kAdaKV) {
      compress_adakv(l, s, b, std::move(candidates), observed_q, observed_begin, eo);
    } else {
      compress_snapkv(l, s, b, candidates, observed_q, observed_begin, eo);
    }
  }
  if (staging && compress) drop_staging(l);
  if (snap_prompt) cache_.note_staged();
  return out.reshape({batch, num_heads, steps, head_dim}).transpose(1, 2).contiguous();
}

at::Tensor simulate_eviction(const arch::ModelSpec& spec, const arch::AttentionInputs& in,
                             const std::vector<int64_t>& windows, memory::MemoryOptions options,
                             const EvictionOptions& eviction, int64_t prefill_chunk,
                             int64_t query_chunk, int64_t prompt_end) {
  HEADWISE_CHECK(prefill_chunk > 0 && in.position_offset == 0,
                 "simulate_eviction: chunk {} from position {}", prefill_chunk, in.position_offset);
  const int64_t steps = in.q.size(2);
  options.batch = in.q.size(0);
  options.context = std::max(options.context, steps);
  EvictionCache cache =
      EvictionCache::allocate_layer(spec, in.layer_id, windows, options, eviction, in.q.device());
  EvictionAttentionCore core(cache, query_chunk);
  core.set_kernel(arch::AttentionKernel::kExplicit);
  // Snap heads choose at the prompt's end: `prompt_end` tokens, the rest decoded after it.
  if (prompt_end > 0) core.begin_prompt(0, prompt_end);
  std::vector<at::Tensor> parts;
  HEADWISE_CHECK(prompt_end <= steps, "simulate_eviction: prompt end {} after {} tokens",
                 prompt_end, steps);
  for (int64_t t0 = 0, n = 0; t0 < steps; t0 += n) {
    // The prompt in prefill chunks, then (with a prompt end) one token at a time, as decoded.
    n = prompt_end > 0 && t0 >= prompt_end ? 1
        : prompt_end > 0                   ? std::min(prefill_chunk, prompt_end - t0)
                                           : std::min(prefill_chunk, steps - t0);
    arch::AttentionInputs chunk = in;
    chunk.q = in.q.slice(2, t0, t0 + n);
    chunk.k = in.k.slice(2, t0, t0 + n);
    chunk.v = in.v.slice(2, t0, t0 + n);
    chunk.position_offset = t0;
    if (in.output_gate.defined()) chunk.output_gate = in.output_gate.slice(1, t0, t0 + n);
    parts.push_back(core.attend(chunk));
    if (prompt_end > 0 && t0 + n == prompt_end) core.end_prompt();
  }
  return at::cat(parts, 1);
}

}  // namespace headwise::runtime

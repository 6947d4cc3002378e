#pragma once
// Causal softmax attention with a per-KV-head history window, query-chunked so the workspace
// is O(chunk x T), never O(T^2). This is the reference every faster path is tested against.
#include <ATen/ATen.h>

#include <span>

#include "headwise/arch/model.hpp"
#include "headwise/core/window.hpp"

namespace headwise::arch {

// Window semantics: arch/visible_keys.hpp (a query at position t sees keys at positions
// [t - w + 1, t], plus the first `sink_tokens` positions; kFullWindow means unbounded).
// `kv_windows` has one entry per KV head; all query heads of a GQA group share it.
// Numerics follow HF eager attention: scores in the activation dtype, softmax in fp32,
// probabilities cast back before multiplying V.
// Returns [B, T, num_heads, head_dim]. With `first_query` > 0 only the queries from that index on
// are computed and the rows before it are zero (for a last layer whose earlier rows feed nothing).
at::Tensor windowed_attention(const AttentionInputs& inputs, std::span<const int64_t> kv_windows,
                              int64_t sink_tokens, int64_t chunk, int64_t first_query = 0);

// Same window for every KV head.
at::Tensor windowed_attention(const AttentionInputs& inputs, int64_t window, int64_t sink_tokens,
                              int64_t chunk);

// windowed_attention with one window for every KV head through ATen's fused attention
// (fused_masked_attention, which has a backward): each query chunk attends only to the sinks and
// the keys its window can reach. Rounding differs from windowed_attention in the last bits, so
// only paths that need no bit-parity use it (duo's gate training in eval). Falls back to
// windowed_attention for sink logits and logit soft-capping.
at::Tensor fused_windowed_attention(const AttentionInputs& inputs, int64_t window,
                                    int64_t sink_tokens, int64_t chunk);

// Boolean mask [num_kv_heads, Tq, Tk] of visible (query, key) pairs (visible_keys per head) for
// positions q_begin.. and k_begin.. (absolute).
at::Tensor window_mask(int64_t q_begin, int64_t q_len, int64_t k_begin, int64_t k_len,
                       std::span<const int64_t> kv_windows, int64_t sink_tokens,
                       const at::Device& device);

}  // namespace headwise::arch

#pragma once
// Attention of the answer span (answer_span.hpp): the queries at positions [P, P + S) of C
// candidate runs of one sequence attend over keys every candidate shares (the layer's cached
// keys before P, or all of the measured layer's keys) and over keys of their own (the span's
// keys as that candidate computed them). The two key sets are merged exactly as one softmax over
// their union (online-softmax partials), so the shared keys are read once for all candidates:
// a candidate's prompt is never copied.
#include <ATen/ATen.h>

#include <cstdint>

namespace headwise::calib {

// Keys [B, kv, N, hd] (and values) at the consecutive positions [first_position, first_position +
// N).
struct KeyBlock {
  at::Tensor k;
  at::Tensor v;
  int64_t first_position = 0;
};

// What shapes a layer's attention besides its keys.
struct SpanAttentionShape {
  double scaling = 1.0;
  double logit_softcap = 0.0;  // 0: none
  at::Tensor sink_logits;      // [heads] learned sink logits (gpt-oss), or undefined
  int64_t window = 0;          // arch::visible_keys' window (kFullWindow: causal only)
  int64_t sink_tokens = 0;
};

// `q`: [B * C, heads, S, hd] at positions [span_begin, span_begin + S), row b * C + c for
// sequence b of `shared` and candidate c. `own` ([B * C, kv, S, hd] at the same positions) may
// be null: the span's keys are then part of `shared`. Keys visible per arch::visible_keys with
// `shape.window` and `shape.sink_tokens`. Returns [B * C, S, heads, hd] in q's dtype; scores in
// q's dtype, softmax and the weighted sum in fp32. Workspace is bounded by chunking query rows.
at::Tensor span_attention(const at::Tensor& q, int64_t span_begin, const KeyBlock& shared,
                          const KeyBlock* own, const SpanAttentionShape& shape);

}  // namespace headwise::calib

#pragma once
// What a KV head with window w and s sink tokens sees: the one definition every attention path
// implements (the forward's windowed attention, calibration's masks and multi-window bands, the
// runtime's ring buffers and eviction baselines, eval's scores, the CUDA kernels).
// tests/arch/visible_keys_test.cpp holds each path to it on one table of cases.
//
//   a query at position q sees the key at position p  <=>  p <= q  and  (w = full  or  q - p < w or
//   p < s)
//
// So window w keeps the last w positions including the query's own, sinks keep the first s
// positions whatever the distance, and nothing ever sees the future. A sliding layer is the same
// rule with its sliding window and no sinks; full (kFullWindow) is plain causal attention.
#include <ATen/ATen.h>

#include <cstdint>

#include "headwise/core/window.hpp"

namespace headwise::arch {

constexpr bool key_visible(int64_t query, int64_t key, int64_t window, int64_t sinks) {
  return key <= query && (window == kFullWindow || query - key < window || key < sinks);
}

// Boolean [Tq, Tk]: key_visible(query_positions[i], key_positions[j], window, sinks), on the
// positions' device. Positions are absolute (int64).
at::Tensor visible_keys(const at::Tensor& query_positions, const at::Tensor& key_positions,
                        int64_t window, int64_t sinks);

// Softmax over the last dimension of fp32 `logits` [..., N]. With `sink_logit` defined (gpt-oss's
// learned per-head logit, broadcastable to [..., 1]) it joins the normalisation and is dropped
// afterwards, so the probabilities of the N keys sum to less than one.
at::Tensor softmax_with_sink_logit(const at::Tensor& logits, const at::Tensor& sink_logit);

// Which attention the runtime decoder runs where both apply.
enum class AttentionKernel {
  kFused,     // fused_masked_attention wherever it applies (the runtime's default)
  kExplicit,  // matmul, mask, fp32 softmax, matmul: the forward's numerics (benchmarks, checks)
};

// softmax(q k^T * scaling, masked to `allowed`) v through ATen's fused attention (flash attention
// on CPU, memory-efficient attention on CUDA): no [Tq, Tk] score tensor (the runtime's eval at
// 8K: 1.36x faster end to end, tools/bench-runtime-attention.sh). q [B, Hq, Tq, hd] with Hq a
// multiple of k/v's heads (query head h uses KV head h / (Hq / Hkv)), k/v [B, Hkv, Tk, hd],
// `allowed` bool [Tq, Tk], the same for every head; every query must see at least one key. The
// softmax runs blockwise, so results differ from the explicit path in the last bits: the runtime
// uses it, calibration and the plain forward keep the explicit path (their bits are what policies
// and parity are checked against). Sink logits and logit soft-capping have no fused form.
at::Tensor fused_masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& allowed, double scaling);

}  // namespace headwise::arch

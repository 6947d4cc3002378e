#include "headwise/arch/attention.hpp"

#include <algorithm>
#include <vector>

#include "headwise/arch/attention_cuda.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {

at::Tensor window_mask(int64_t q_begin, int64_t q_len, int64_t k_begin, int64_t k_len,
                       std::span<const int64_t> kv_windows, int64_t sink_tokens,
                       const at::Device& device) {
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor q_pos = at::arange(q_begin, q_begin + q_len, long_opts);
  const at::Tensor k_pos = at::arange(k_begin, k_begin + k_len, long_opts);
  std::vector<at::Tensor> masks;
  masks.reserve(kv_windows.size());
  for (int64_t w : kv_windows) masks.push_back(visible_keys(q_pos, k_pos, w, sink_tokens));
  return at::stack(masks);  // [nkv, Tq, Tk]
}

at::Tensor windowed_attention(const AttentionInputs& in, std::span<const int64_t> kv_windows,
                              int64_t sink_tokens, int64_t chunk, int64_t first_query) {
  const int64_t batch = in.q.size(0), num_heads = in.q.size(1), steps = in.q.size(2),
                head_dim = in.q.size(3);
  const int64_t num_kv = in.k.size(1);
  HEADWISE_CHECK(static_cast<int64_t>(kv_windows.size()) == num_kv, "{} windows for {} KV heads",
                 kv_windows.size(), num_kv);
  HEADWISE_CHECK(num_heads % num_kv == 0 && in.k.size(2) == steps, "attention shapes q {} k {}",
                 shape_string(in.q.sizes()), shape_string(in.k.sizes()));
  HEADWISE_CHECK(chunk > 0, "chunk must be positive");
  const int64_t group = num_heads / num_kv;
  for (int64_t w : kv_windows) HEADWISE_CHECK(w > 0, "window {} must be positive", w);
  HEADWISE_CHECK(first_query >= 0 && first_query <= steps, "first query {} outside {} steps",
                 first_query, steps);
#ifdef HEADWISE_WITH_CUDA
  // The fused kernel visits only each head's window (no masked work) and needs no O(chunk x T)
  // score workspace; inputs it does not cover take the ATen path below, which runs on CUDA too.
  if (first_query == 0 && cuda_multiwindow_supported(in, 0)) {
    return cuda_windowed_attention(in, kv_windows, sink_tokens);
  }
#endif
  const bool all_bounded =
      std::all_of(kv_windows.begin(), kv_windows.end(), [](int64_t w) { return w != kFullWindow; });
  const int64_t widest = all_bounded ? *std::max_element(kv_windows.begin(), kv_windows.end()) : 0;

  // [B, nkv, g, T, hd]: each KV head multiplies its query group without repeat_kv copies.
  const at::Tensor q = in.q.view({batch, num_kv, group, steps, head_dim});
  const at::Tensor k = in.k.unsqueeze(2);
  const at::Tensor v = in.v.unsqueeze(2);
  at::Tensor out = first_query == 0
                       ? at::empty({batch, steps, num_heads, head_dim}, in.q.options())
                       : at::zeros({batch, steps, num_heads, head_dim}, in.q.options());
  for (int64_t t0 = first_query; t0 < steps; t0 += chunk) {
    const int64_t t1 = std::min(steps, t0 + chunk);
    // Keys older than the widest window are masked for every head; skip them unless sinks
    // need the first positions (then the band is still bounded by t1).
    const int64_t k_begin =
        (all_bounded && sink_tokens == 0) ? std::max<int64_t>(0, t0 - widest + 1) : 0;
    const at::Tensor qc = q.slice(3, t0, t1);
    const at::Tensor kc = k.slice(3, k_begin, t1);
    const at::Tensor vc = v.slice(3, k_begin, t1);
    at::Tensor scores = at::matmul(qc, kc.transpose(-1, -2)) * in.scaling;  // [B, nkv, g, tc, kc]
    if (in.logit_softcap > 0) scores = at::tanh(scores / in.logit_softcap) * in.logit_softcap;
    const at::Tensor allowed =
        window_mask(in.position_offset + t0, t1 - t0, in.position_offset + k_begin, t1 - k_begin,
                    kv_windows, sink_tokens, scores.device())
            .unsqueeze(1);  // [nkv, 1, tc, kc]
    at::Tensor logits =
        scores.to(at::kFloat)
            .masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    const at::Tensor sink =
        in.sink_logits.defined() ? in.sink_logits.view({1, num_kv, group, 1, 1}) : at::Tensor();
    const at::Tensor probs = softmax_with_sink_logit(logits, sink);
    const at::Tensor chunk_out =
        at::matmul(probs.to(in.v.scalar_type()), vc);  // [B, nkv, g, tc, hd]
    out.slice(1, t0, t1).copy_(
        chunk_out.reshape({batch, num_heads, t1 - t0, head_dim}).transpose(1, 2));
  }
  return out;
}

at::Tensor windowed_attention(const AttentionInputs& inputs, int64_t window, int64_t sink_tokens,
                              int64_t chunk) {
  const std::vector<int64_t> windows(static_cast<size_t>(inputs.k.size(1)), window);
  return windowed_attention(inputs, windows, sink_tokens, chunk);
}

at::Tensor fused_windowed_attention(const AttentionInputs& in, int64_t window, int64_t sink_tokens,
                                    int64_t chunk) {
  if (in.sink_logits.defined() || in.logit_softcap > 0)
    return windowed_attention(in, window, sink_tokens, chunk);
  HEADWISE_CHECK(chunk > 0 && window > 0 && sink_tokens >= 0, "chunk {}, window {}, sinks {}",
                 chunk, window, sink_tokens);
  const int64_t steps = in.q.size(2);
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(in.q.device());
  std::vector<at::Tensor> parts;
  for (int64_t t0 = 0; t0 < steps; t0 += chunk) {
    const int64_t t1 = std::min(steps, t0 + chunk);
    // The keys any query of the chunk can see: the sinks, then the band its window reaches.
    const int64_t band = window == kFullWindow ? 0 : std::max<int64_t>(0, t0 - window + 1);
    const int64_t sinks = std::min(sink_tokens, band);
    at::Tensor index = at::arange(band, t1, long_opts);
    if (sinks > 0) index = at::cat({at::arange(sinks, long_opts), index});
    const at::Tensor allowed =
        visible_keys(at::arange(in.position_offset + t0, in.position_offset + t1, long_opts),
                     index + in.position_offset, window, sink_tokens);
    parts.push_back(fused_masked_attention(in.q.slice(2, t0, t1), in.k.index_select(2, index),
                                           in.v.index_select(2, index), allowed, in.scaling));
  }
  return at::cat(parts, 2)
      .transpose(1, 2)
      .contiguous();  // [B, T, heads, hd], as windowed_attention
}

at::Tensor ExactAttentionCore::attend(const AttentionInputs& inputs) {
  const int64_t window = inputs.sliding_window > 0 ? inputs.sliding_window : kFullWindow;
  return windowed_attention(inputs, window, /*sink_tokens=*/0, chunk_);
}

}  // namespace headwise::arch

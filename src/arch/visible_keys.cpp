#include "headwise/arch/visible_keys.hpp"

#include "headwise/arch/model.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {

at::Tensor visible_keys(const at::Tensor& query_positions, const at::Tensor& key_positions,
                        int64_t window, int64_t sinks) {
  HEADWISE_CHECK(window > 0 && sinks >= 0, "window {} must be positive and sinks {} non-negative",
                 window, sinks);
  const at::Tensor q = query_positions.view({-1, 1});
  const at::Tensor k = key_positions.view({1, -1});
  // Comparisons against per-query bounds ([Tq, 1]) instead of a [Tq, Tk] int64 distance: the
  // same booleans, a third of the memory traffic (this runs once per attention chunk).
  const at::Tensor causal = k <= q;
  if (window == kFullWindow) return causal;
  return causal & ((k > q - window) | (k < sinks));
}

at::Tensor softmax_with_sink_logit(const at::Tensor& logits, const at::Tensor& sink_logit) {
  if (!sink_logit.defined()) return at::softmax(logits, -1);
  const int64_t keys = logits.size(-1);
  std::vector<int64_t> shape = logits.sizes().vec();
  shape.back() = 1;
  at::Tensor combined = at::cat({logits, sink_logit.to(at::kFloat).expand(shape)}, -1);
  combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
  return at::softmax(combined, -1).slice(-1, 0, keys);
}

at::Tensor fused_masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& allowed, double scaling) {
  HEADWISE_CHECK(
      q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() && q.size(1) % k.size(1) == 0,
      "fused attention shapes q {} k {} v {}", shape_string(q.sizes()), shape_string(k.sizes()),
      shape_string(v.sizes()));
  const int64_t batch = q.size(0), heads = q.size(1), steps = q.size(2), head_dim = q.size(3);
  const int64_t kv_heads = k.size(1), group = heads / kv_heads;
  HEADWISE_CHECK(allowed.scalar_type() == at::kBool && allowed.dim() == 2 &&
                     allowed.size(0) == steps && allowed.size(1) == k.size(2),
                 "fused attention mask {} for {} queries and {} keys",
                 shape_string(allowed.sizes()), steps, k.size(2));
  // A KV head's query group becomes one run of group x Tq rows over the same keys, so every
  // backend sees equal head counts (CUDA's memory-efficient kernel takes a mask but no GQA).
  const at::Tensor rows = q.reshape({batch, kv_heads, group * steps, head_dim});
  const at::Tensor mask = group == 1 ? allowed : allowed.repeat({group, 1});
  return at::scaled_dot_product_attention(rows, k, v, mask, /*dropout_p=*/0.0, /*is_causal=*/false,
                                          scaling)
      .reshape({batch, heads, steps, head_dim});
}

}  // namespace headwise::arch

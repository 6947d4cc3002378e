#include "headwise/arch/visible_keys.hpp"

#include "headwise/core/error.hpp"

namespace headwise::arch {

at::Tensor visible_keys(const at::Tensor& query_positions, const at::Tensor& key_positions, int64_t window,
                        int64_t sinks) {
  HEADWISE_CHECK(window > 0 && sinks >= 0, "window {} must be positive and sinks {} non-negative", window, sinks);
  const at::Tensor q = query_positions.view({-1, 1});
  const at::Tensor k = key_positions.view({1, -1});
  const at::Tensor distance = q - k;
  const at::Tensor causal = distance >= 0;
  if (window == kFullWindow) return causal;
  return causal & ((distance < window) | (k < sinks));
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

}  // namespace headwise::arch

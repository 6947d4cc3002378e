#include "headwise/arch/moe.hpp"

#include "headwise/arch/ops.hpp"

namespace headwise::arch {
namespace {

at::Tensor expert_forward(const at::Tensor& x, const ExpertWeights& e) {
  at::Tensor gate, up;
  if (e.gate_up.defined()) {
    auto halves = arch::linear(x, e.gate_up).chunk(2, -1);
    gate = halves[0];
    up = halves[1];
  } else {
    gate = arch::linear(x, e.gate);
    up = arch::linear(x, e.up);
  }
  return arch::linear(at::silu(gate) * up, e.down);
}

}  // namespace

MoeRouting route_top_k(const at::Tensor& x, const at::Tensor& router, int64_t top_k,
                       bool norm_topk_prob, MoeRouter kind) {
  const at::Tensor logits = arch::linear(x, router);
  if (kind == MoeRouter::kTopKThenSoftmax) {
    auto [top_logits, indices] = at::topk(logits.to(at::kFloat), top_k, -1);
    return {at::softmax(top_logits, -1).to(logits.scalar_type()), indices};
  }
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat);
  auto [values, indices] = at::topk(probs, top_k, -1);
  if (norm_topk_prob) values = values / values.sum(-1, /*keepdim=*/true);
  return {values.to(logits.scalar_type()), indices};
}

at::Tensor sparse_moe_block(const at::Tensor& x, const SparseMoeWeights& w, int64_t top_k,
                            bool norm_topk_prob, MoeRouter kind) {
  const int64_t hidden = x.size(-1);
  const at::Tensor flat = x.reshape({-1, hidden});
  // Jamba's block has no shared expert (shared_gate undefined).
  const at::Tensor shared = w.shared_gate.defined()
                                ? gated_mlp(flat, w.shared_gate, w.shared_up, w.shared_down)
                                : at::Tensor();
  const MoeRouting routing = route_top_k(flat, w.router, top_k, norm_topk_prob, kind);

  // Experts in ascending order, each adding its tokens' weighted outputs (HF Qwen3NextExperts).
  at::Tensor routed = at::zeros_like(flat);
  const at::Tensor hit =
      std::get<0>(at::_unique(routing.experts.flatten(), /*sorted=*/true)).to(at::kCPU);
  const auto* ids = hit.data_ptr<int64_t>();
  for (int64_t n = 0; n < hit.numel(); ++n) {
    const int64_t e = ids[n];
    const at::Tensor where = at::nonzero(routing.experts == e);  // [M, 2]: (token, slot)
    const at::Tensor token = where.select(1, 0), slot = where.select(1, 1);
    const at::Tensor out = expert_forward(flat.index_select(0, token), w.expert(e));
    const at::Tensor scale = routing.weights.index({token, slot}).unsqueeze(-1);
    routed.index_add_(0, token, (out * scale).to(routed.scalar_type()));
  }
  if (!shared.defined()) return routed.reshape(x.sizes());
  if (!w.shared_expert_gate.defined()) return (routed + shared).reshape(x.sizes());
  const at::Tensor gated_shared = at::sigmoid(arch::linear(flat, w.shared_expert_gate)) * shared;
  return (routed + gated_shared).reshape(x.sizes());
}

}  // namespace headwise::arch

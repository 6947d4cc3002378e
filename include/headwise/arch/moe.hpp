#pragma once
// Sparse MoE block of Qwen3-Next (and Qwen3-MoE-style models): softmax router over all
// experts in fp32, top-k, optional renormalisation, SwiGLU experts, plus a shared expert scaled
// by sigmoid(shared_expert_gate x). Granite 4.0's block is the same with the softmax taken over
// the top-k logits and an ungated shared expert. Same op order as HF so bf16 sums round the
// same way.
#include <ATen/ATen.h>

#include <functional>

namespace headwise::arch {

// One expert's SwiGLU weights. Either `gate_up` [2I, H] (v5 fused rows: gate then up) or
// `gate` and `up` [I, H] each; `down` [H, I].
struct ExpertWeights {
  at::Tensor gate_up;
  at::Tensor gate;
  at::Tensor up;
  at::Tensor down;
};

struct SparseMoeWeights {
  at::Tensor router;  // [E, H]
  // Loads expert e on demand: only experts some token routes to are touched.
  std::function<ExpertWeights(int64_t)> expert;
  at::Tensor shared_gate, shared_up,
      shared_down;                // shared expert SwiGLU (undefined: none, as Jamba)
  at::Tensor shared_expert_gate;  // [1, H]; undefined: the shared expert is added as is
};

enum class MoeRouter {
  kSoftmaxThenTopK,  // Qwen: softmax over all experts in fp32, top-k (renormalised if asked)
  kTopKThenSoftmax,  // Granite: top-k of the logits (in fp32), softmax over those k
};

struct MoeRouting {
  at::Tensor weights;  // [N, k] in the activation dtype
  at::Tensor experts;  // [N, k] int64
};

// HF Qwen3NextTopKRouter: softmax(x W^T) in fp32, top-k, renormalise if asked, cast back.
MoeRouting route_top_k(const at::Tensor& x, const at::Tensor& router, int64_t top_k,
                       bool norm_topk_prob, MoeRouter kind = MoeRouter::kSoftmaxThenTopK);

// x [B, T, H] → [B, T, H].
at::Tensor sparse_moe_block(const at::Tensor& x, const SparseMoeWeights& w, int64_t top_k,
                            bool norm_topk_prob, MoeRouter kind = MoeRouter::kSoftmaxThenTopK);

}  // namespace headwise::arch

// Qwen3-Next (`qwen3_next`, Qwen3NextForCausalLM): gated DeltaNet with grouped qkvz/ba
// projections, gated full attention every few layers, sparse MoE with a shared expert (the
// MoE block is QwenHybridModel's, shared with Qwen3.5-MoE).
#include <memory>

#include "headwise/arch/ops.hpp"
#include "headwise/arch/qwen_hybrid.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/weight_list.hpp"

namespace headwise::arch {
namespace {

class Qwen3NextModel final : public QwenHybridModel {
 public:
  using QwenHybridModel::QwenHybridModel;

 protected:
  // in_proj_qkvz rows come per key-head group [q (dk) | k (dk) | v (r*dv) | z (r*dv)] and
  // in_proj_ba per group [b (r) | a (r)] (Megatron layout, HF fix_query_key_value_ordering).
  GatedDeltaInputs linear_projections(int64_t layer, const at::Tensor& x) override {
    const GatedDeltaShape& s = config().linear;
    const int64_t batch = x.size(0), steps = x.size(1), r = s.value_heads_per_key_head();
    const at::Tensor qkvz =
        arch::linear(x, layer_weight(layer, "linear_attn.in_proj_qkvz.weight"))
            .view({batch, steps, s.num_k_heads, 2 * s.k_head_dim + 2 * r * s.v_head_dim});
    const auto parts =
        qkvz.split_with_sizes({s.k_head_dim, s.k_head_dim, r * s.v_head_dim, r * s.v_head_dim}, 3);
    const at::Tensor ba = arch::linear(x, layer_weight(layer, "linear_attn.in_proj_ba.weight"))
                              .view({batch, steps, s.num_k_heads, 2 * r});
    const auto b_and_a = ba.split_with_sizes({r, r}, 3);
    GatedDeltaInputs in;
    in.mixed_qkv =
        at::cat({parts[0].reshape({batch, steps, -1}), parts[1].reshape({batch, steps, -1}),
                 parts[2].reshape({batch, steps, -1})},
                -1);
    in.z = parts[3].reshape({batch, steps, s.num_v_heads, s.v_head_dim});
    in.b = b_and_a[0].reshape({batch, steps, s.num_v_heads});
    in.a = b_and_a[1].reshape({batch, steps, s.num_v_heads});
    return in;
  }

  void add_linear_projection_weights(LayerWeights& layer) const override {
    const GatedDeltaShape& s = config().linear;
    const int64_t h = config().hidden_size;
    layer.linear("linear_attn.in_proj_qkvz", 2 * s.key_dim() + 2 * s.value_dim(), h);
    layer.linear("linear_attn.in_proj_ba", 2 * s.num_v_heads, h);
  }
};

const RegisterArchitecture kRegisterQwen3Next{qwen_hybrid_architecture<Qwen3NextModel>(
    "qwen3_next", "qwen3_next", QwenFeedForward::kSparseStep)};

}  // namespace
}  // namespace headwise::arch

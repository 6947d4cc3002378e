// Qwen3.5 text (`qwen3_5_text`, Qwen3_5ForCausalLM; also the text part of the `qwen3_5`
// multimodal wrapper, whose config nests it under text_config and whose checkpoint keeps it
// under model.language_model.). Same layers as Qwen3-Next but un-grouped DeltaNet projections
// and a dense MLP. Qwen3.5-MoE (`qwen3_5_moe_text`, and its `qwen3_5_moe` wrapper) is the same
// with Qwen3-Next's sparse MoE block (renormalised top-k, gated shared expert) on every layer. Its
// interleaved MRoPE reduces exactly to partial RoPE for text-only positions (all three position
// rows equal), which is what is computed here.
#include <memory>

#include "headwise/arch/ops.hpp"
#include "headwise/arch/qwen_hybrid.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/weight_list.hpp"

namespace headwise::arch {
namespace {

class Qwen35TextModel final : public QwenHybridModel {
 public:
  using QwenHybridModel::QwenHybridModel;

 protected:
  // in_proj_qkv is plain [q (nk*dk) | k (nk*dk) | v (nv*dv)]; z, b, a have their own projections.
  GatedDeltaInputs linear_projections(int64_t layer, const at::Tensor& x) override {
    const GatedDeltaShape& s = config().linear;
    const int64_t batch = x.size(0), steps = x.size(1);
    GatedDeltaInputs in;
    in.mixed_qkv = arch::linear(x, layer_weight(layer, "linear_attn.in_proj_qkv.weight"));
    in.z = arch::linear(x, layer_weight(layer, "linear_attn.in_proj_z.weight"))
               .reshape({batch, steps, s.num_v_heads, s.v_head_dim});
    in.b = arch::linear(x, layer_weight(layer, "linear_attn.in_proj_b.weight"));
    in.a = arch::linear(x, layer_weight(layer, "linear_attn.in_proj_a.weight"));
    return in;
  }

  void add_linear_projection_weights(LayerWeights& layer) const override {
    const GatedDeltaShape& s = config().linear;
    const int64_t h = config().hidden_size;
    layer.linear("linear_attn.in_proj_qkv", s.conv_dim(), h);
    layer.linear("linear_attn.in_proj_z", s.value_dim(), h);
    layer.linear("linear_attn.in_proj_b", s.num_v_heads, h);
    layer.linear("linear_attn.in_proj_a", s.num_v_heads, h);
  }
};

const RegisterArchitecture kRegisterQwen35{
    qwen_hybrid_architecture<Qwen35TextModel>("qwen3_5", "qwen3_5_text", QwenFeedForward::kDense)};
const RegisterArchitecture kRegisterQwen35Moe{qwen_hybrid_architecture<Qwen35TextModel>(
    "qwen3_5_moe", "qwen3_5_moe_text", QwenFeedForward::kEveryLayerMoe)};

}  // namespace
}  // namespace headwise::arch

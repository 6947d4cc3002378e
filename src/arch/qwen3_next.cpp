// Qwen3-Next (`qwen3_next`, Qwen3NextForCausalLM): gated DeltaNet with grouped qkvz/ba
// projections, gated full attention every few layers, sparse MoE with a shared expert.
#include <memory>

#include "headwise/arch/moe.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/qwen_hybrid.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/io/checkpoint.hpp"

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

  std::vector<WeightRequirement> linear_projection_weights(int64_t layer) const override {
    const GatedDeltaShape& s = config().linear;
    const int64_t h = config().hidden_size;
    return {requirement(layer, "linear_attn.in_proj_qkvz.weight",
                        {2 * s.key_dim() + 2 * s.value_dim(), h}),
            requirement(layer, "linear_attn.in_proj_ba.weight", {2 * s.num_v_heads, h})};
  }

  at::Tensor feed_forward(int64_t layer, const at::Tensor& x) override {
    if (!config().is_moe_layer(layer)) return QwenHybridModel::feed_forward(layer, x);
    SparseMoeWeights w;
    w.router = layer_weight(layer, "mlp.gate.weight");
    w.shared_gate = layer_weight(layer, "mlp.shared_expert.gate_proj.weight");
    w.shared_up = layer_weight(layer, "mlp.shared_expert.up_proj.weight");
    w.shared_down = layer_weight(layer, "mlp.shared_expert.down_proj.weight");
    w.shared_expert_gate = layer_weight(layer, "mlp.shared_expert_gate.weight");
    const bool fused = has_fused_experts(layer);
    w.expert = [this, layer, fused](int64_t e) {
      ExpertWeights ew;
      if (fused) {
        ew.gate_up = layer_weight(layer, "mlp.experts.gate_up_proj").select(0, e);
        ew.down = layer_weight(layer, "mlp.experts.down_proj").select(0, e);
      } else {
        const std::string p = fmt::format("mlp.experts.{}.", e);
        ew.gate = layer_weight(layer, p + "gate_proj.weight");
        ew.up = layer_weight(layer, p + "up_proj.weight");
        ew.down = layer_weight(layer, p + "down_proj.weight");
      }
      return ew;
    };
    return sparse_moe_block(x, w, config().num_experts_per_tok, config().norm_topk_prob);
  }

  std::vector<WeightRequirement> feed_forward_weights(int64_t layer) const override {
    if (!config().is_moe_layer(layer)) return QwenHybridModel::feed_forward_weights(layer);
    const QwenHybridConfig& c = config();
    const int64_t h = c.hidden_size, e = c.num_experts, i = c.moe_intermediate_size;
    std::vector<WeightRequirement> all =
        dense_mlp_weights(layer, "mlp.shared_expert", c.shared_expert_intermediate_size);
    all.push_back(requirement(layer, "mlp.gate.weight", {e, h}));
    all.push_back(requirement(layer, "mlp.shared_expert_gate.weight", {1, h}));
    if (has_fused_experts(layer)) {
      // transformers v5 in-memory layout, as some converted checkpoints store it.
      all.push_back(requirement(layer, "mlp.experts.gate_up_proj", {e, 2 * i, h}));
      all.push_back(requirement(layer, "mlp.experts.down_proj", {e, h, i}));
      return all;
    }
    for (int64_t x = 0; x < e; ++x) {
      auto per_expert = dense_mlp_weights(layer, fmt::format("mlp.experts.{}", x), i);
      all.insert(all.end(), per_expert.begin(), per_expert.end());
    }
    return all;
  }

 private:
  bool has_fused_experts(int64_t layer) const {
    return checkpoint().contains(layer_prefix(layer) + "mlp.experts.gate_up_proj");
  }
};

const RegisterArchitecture kRegisterQwen3Next{Architecture{
    .name = "qwen3_next",
    .model_types = {"qwen3_next"},
    .build_spec =
        [](const ConfigReader& reader) {
          return qwen_hybrid_spec(read_qwen_hybrid_config(reader, true));
        },
    .create_model = [](const ModelSpec& spec, std::shared_ptr<const io::Checkpoint> checkpoint,
                       const ModelOptions& options) -> std::unique_ptr<DecoderModel> {
      const ConfigReader reader(spec.text_config, (checkpoint->dir() / "config.json").string());
      return std::make_unique<Qwen3NextModel>(spec, std::move(checkpoint), options,
                                              read_qwen_hybrid_config(reader, true));
    },
}};

}  // namespace
}  // namespace headwise::arch

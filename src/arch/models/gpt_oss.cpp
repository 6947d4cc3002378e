// GPT-OSS (`gpt_oss`): alternating sliding (window 128) and global attention layers with learned
// attention-sink logits, a top-k MoE of clamped-SwiGLU experts, YaRN RoPE. Mirrors transformers
// 5.17 models/gpt_oss/modeling_gpt_oss.py. The sinks are logits, not cached tokens: they join
// each head's softmax and cost no cache memory.
//
// Published checkpoints store the experts in MXFP4 (`*_blocks` / `*_scales`); those are refused
// with the tensor named (dequantize with transformers first); bf16/fp32 experts load as they are.
#include <cmath>
#include <string>
#include <vector>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/rope_params.hpp"
#include "headwise/arch/state_shapes.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {
namespace {

// GptOssConfig with its class defaults.
struct GptOssConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, sliding_window = 0;
  int64_t num_experts = 0, top_k = 0;
  double rms_norm_eps = 1e-5, swiglu_limit = 7.0;
  bool tie_word_embeddings = false, attention_bias = true;
  std::vector<LayerKind> kinds;
  RopeParameters rope;
};

constexpr double kGluAlpha = 1.702;  // GptOssExperts.alpha (not in the config)

std::vector<LayerKind> read_kinds(const ConfigReader& config, int64_t num_layers) {
  std::vector<LayerKind> kinds;
  if (config.has("layer_types")) {
    const auto types = read_layer_types(config, "layer_types", num_layers);
    for (int64_t i = 0; i < num_layers; ++i) {
      kinds.push_back(layer_kind_of_type(config, types[static_cast<size_t>(i)], i,
                                         {{"full_attention", LayerKind::kFullAttention},
                                          {"sliding_attention", LayerKind::kSlidingAttention}}));
    }
    return kinds;
  }
  // GptOssConfig default: even layers sliding, odd layers full.
  for (int64_t i = 0; i < num_layers; ++i) {
    kinds.push_back(i % 2 == 0 ? LayerKind::kSlidingAttention : LayerKind::kFullAttention);
  }
  return kinds;
}

GptOssConfig read_config(const ConfigReader& r) {
  GptOssConfig c;
  c.vocab_size = r.get_positive_int("vocab_size", 201088);
  c.hidden_size = r.get_positive_int("hidden_size", 2880);
  c.intermediate_size = r.get_positive_int("intermediate_size", 2880);
  c.num_layers = r.get_positive_int("num_hidden_layers", 36);
  c.num_heads = r.get_positive_int("num_attention_heads", 64);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", 8);
  c.head_dim = r.get_positive_int("head_dim", 64);
  c.sliding_window = r.get_positive_int("sliding_window", 128);
  c.num_experts = r.get_positive_int("num_local_experts", 128);
  c.top_k = r.get_positive_int("num_experts_per_tok", 4);
  if (c.top_k > c.num_experts) r.fail("num_experts_per_tok", "exceeds num_local_experts");
  if (c.num_heads % c.num_kv_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads");
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-5);
  c.swiglu_limit = r.get_double("swiglu_limit", 7.0);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.attention_bias = r.get_bool("attention_bias", true);
  c.kinds = read_kinds(r, c.num_layers);
  c.rope = read_single_rope_parameters(r, 150000.0);
  return c;
}

ModelSpec build_gpt_oss_spec(const ConfigReader& r) {
  return attention_stack_spec_of(read_config(r));
}

class GptOssModel final : public DecoderModel {
 public:
  GptOssModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
              const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_config(text_config_reader())),
        inv_freq_(rope_inv_freq(config_.rope, config_.head_dim, device())) {
    refuse_quantized_experts();
  }

  at::Tensor embed(const at::Tensor& input_ids) override { return embed_tokens(input_ids); }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    return pre_norm_residual(
        hidden, layer_tensor(layer, "input_layernorm.weight"),
        layer_tensor(layer, "post_attention_layernorm.weight"), config_.rms_norm_eps,
        NormStyle::kScaleInFp32, [&](const at::Tensor& x) { return attention(layer, x, run); },
        [&](const at::Tensor& y) { return experts(layer, y); });
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, "model.norm.weight", config_.rms_norm_eps, NormStyle::kScaleInFp32,
                         config_.tie_word_embeddings);
  }

  std::vector<WeightRequirement> required_weights() const override {
    const GptOssConfig& c = config_;
    const int64_t h = c.hidden_size, inter = c.intermediate_size, e = c.num_experts;
    WeightList weights = decoder_weights(outer_weights_of(c));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights layer = weights.layer(i);
      layer.attention("self_attn.", attention_projections_of(c, c.attention_bias));
      layer.add("self_attn.sinks", {c.num_heads});
      layer.linear("mlp.router", e, h, /*bias=*/true);
      layer.add("mlp.experts.gate_up_proj", {e, h, 2 * inter});
      layer.add("mlp.experts.gate_up_proj_bias", {e, 2 * inter});
      layer.add("mlp.experts.down_proj", {e, inter, h});
      layer.add("mlp.experts.down_proj_bias", {e, h});
      layer.add("input_layernorm.weight", {h});
      layer.add("post_attention_layernorm.weight", {h});
    }
    return std::move(weights).take();
  }

 private:
  void refuse_quantized_experts() const {
    const std::string blocks = "model.layers.0.mlp.experts.gate_up_proj_blocks";
    if (has_weight(blocks)) {
      throw_unsupported(
          "{}: the experts are MXFP4-quantized ('{}'); headwise reads bf16/fp32 weights: "
          "dequantize "
          "with transformers (Mxfp4Config(dequantize=True)) and save_pretrained first",
          checkpoint().dir().string(), blocks);
    }
  }

  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    auto heads = [&](const char* name, int64_t n) {
      return layer_linear(layer, name, x, config_.attention_bias)
          .view({batch, steps, n, hd})
          .transpose(1, 2);
    };
    const RotaryTable table = rotary_table(inv_freq_, run.position_offset, steps,
                                           rope_attention_factor(config_.rope), x.scalar_type());
    const bool sliding = config_.kinds[static_cast<size_t>(layer)] == LayerKind::kSlidingAttention;
    return attend_and_project(
        {.layer_id = layer,
         .q = apply_rotary(heads("self_attn.q_proj", config_.num_heads), table),
         .k = apply_rotary(heads("self_attn.k_proj", config_.num_kv_heads), table),
         .v = heads("self_attn.v_proj", config_.num_kv_heads),
         .scaling = std::pow(static_cast<double>(hd), -0.5),
         .sink_logits = layer_tensor(layer, "self_attn.sinks"),
         .sliding_window = sliding ? config_.sliding_window : 0},
        run, "self_attn.o_proj", config_.attention_bias);
  }

  // GptOssMLP: router logits with bias, softmax over the top-k logits, then per routed expert
  // (ascending, as HF walks them) the clamped SwiGLU on interleaved gate/up columns, weighted and
  // index-added into the output in the activation dtype.
  at::Tensor experts(int64_t layer, const at::Tensor& x) {
    const auto shape = x.sizes().vec();
    const at::Tensor flat = x.reshape({-1, config_.hidden_size});
    const at::Tensor router_logits = arch::linear(flat, layer_tensor(layer, "mlp.router.weight"),
                                                  layer_tensor(layer, "mlp.router.bias"));
    const auto [top_values, top_experts] = router_logits.topk(config_.top_k, -1);
    const at::Tensor routing = at::softmax(top_values, 1, top_values.scalar_type());
    const at::Tensor& gate_up_proj = layer_tensor(layer, "mlp.experts.gate_up_proj");
    const at::Tensor& gate_up_bias = layer_tensor(layer, "mlp.experts.gate_up_proj_bias");
    const at::Tensor& down_proj = layer_tensor(layer, "mlp.experts.down_proj");
    const at::Tensor& down_bias = layer_tensor(layer, "mlp.experts.down_proj_bias");
    at::Tensor out = at::zeros_like(flat);
    const at::Tensor hit = at::one_hot(top_experts, config_.num_experts)
                               .sum(at::IntArrayRef{0, 1})
                               .gt(0)
                               .nonzero()
                               .flatten()
                               .cpu();
    const double limit = config_.swiglu_limit;
    for (int64_t i = 0; i < hit.size(0); ++i) {
      const int64_t e = hit[i].item<int64_t>();
      // [k, N] mask of this expert, positions in (slot, token) order like torch.where on it.
      const auto where = at::where(top_experts.transpose(0, 1).eq(e));
      const at::Tensor& slot = where[0];
      const at::Tensor& token = where[1];
      // A few tokens per expert: small products, pinned to one MKL thread (reproducible_math.hpp).
      const SmallGemmOnOneThread pinned(
          token.size(0), std::min(gate_up_proj[e].size(-1), down_proj[e].size(-1)), flat.is_cpu());
      const at::Tensor gate_up =
          at::matmul(flat.index_select(0, token), gate_up_proj[e]) + gate_up_bias[e];
      const at::Tensor gate = gate_up.slice(-1, 0, c10::nullopt, 2).clamp_max(limit);
      const at::Tensor up = gate_up.slice(-1, 1, c10::nullopt, 2).clamp(-limit, limit);
      const at::Tensor glu = gate * at::sigmoid(gate * kGluAlpha);
      const at::Tensor expert_out = at::matmul((up + 1) * glu, down_proj[e]) + down_bias[e];
      const at::Tensor weighted = expert_out * routing.index({token, slot}).unsqueeze(-1);
      out.index_add_(0, token, weighted.to(flat.scalar_type()));
    }
    return out.view(shape);
  }

  GptOssConfig config_;
  at::Tensor inv_freq_;
};

const RegisterArchitecture kRegister(
    {"gpt_oss", {"gpt_oss"}, build_gpt_oss_spec, create_model_of<GptOssModel>});

}  // namespace
}  // namespace headwise::arch

// GraniteMoeHybrid (`granitemoehybrid`, Granite 4.0-H): Mamba-2 (Bamba's mixer) and attention
// layers by `layer_types`, each followed by a top-k MoE of SwiGLU experts plus a shared SwiGLU,
// with Granite's multipliers: embeddings x embedding_multiplier, each residual branch x
// residual_multiplier, attention scaled by attention_multiplier, logits / logits_scaling; RoPE
// only with position_embedding_type "rope". Mirrors transformers 5.17
// models/granitemoehybrid/modeling_granitemoehybrid.py.
#include <cmath>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/mamba2.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/moe.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/rope_params.hpp"
#include "headwise/arch/state_shapes.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

// Hub configs say "mamba"/"attention"; transformers 5 remaps them to linear/full names.
bool is_attention_type(const ConfigReader& config, const std::string& type) {
  if (type == "attention" || type == "full_attention") return true;
  if (type == "mamba" || type == "linear_attention") return false;
  config.fail("layer_types",
              fmt::format("has unknown entry '{}' (expected mamba or attention)", type));
}

// GraniteMoeHybridConfig with its class defaults (transformers 5.17).
struct GraniteConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, shared_intermediate_size = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, num_experts = 0, top_k = 0;
  double rms_norm_eps = 1e-6, embedding_multiplier = 1, residual_multiplier = 1,
         attention_multiplier = 1, logits_scaling = 1;
  bool tie_word_embeddings = false, attention_bias = false, proj_bias = false, conv_bias = true,
       rope = false;
  std::vector<LayerKind> kinds;
  RopeParameters rope_parameters;
  Mamba2Shape mamba;
  Mamba2Options mixer;
};

GraniteConfig read_granite_config(const ConfigReader& r) {
  GraniteConfig c;
  const int64_t num_layers = r.get_positive_int("num_hidden_layers", 32);
  std::vector<std::string> types(static_cast<size_t>(num_layers),
                                 "mamba");  // HF default: all mamba
  if (r.has("layer_types") && !r.get("layer_types").is_null())
    types = read_layer_types(r, "layer_types", num_layers);
  for (const auto& type : types) {
    c.kinds.push_back(is_attention_type(r, type) ? LayerKind::kFullAttention : LayerKind::kMamba);
  }
  c.vocab_size = r.get_positive_int("vocab_size", 32000);
  c.hidden_size = r.get_positive_int("hidden_size", 4096);
  c.intermediate_size = r.get_positive_int("intermediate_size", 11008);
  c.shared_intermediate_size = r.get_positive_int("shared_intermediate_size", 1024);
  c.num_heads = r.get_positive_int("num_attention_heads", 32);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", c.num_heads);
  c.head_dim = r.get_positive_int("head_dim", c.hidden_size / c.num_heads);
  c.num_experts = r.get_int("num_local_experts", 8);
  if (c.num_experts < 0) r.fail("num_local_experts", "must not be negative");
  c.top_k = c.num_experts > 0 ? r.get_positive_int("num_experts_per_tok", 2) : 0;
  if (c.top_k > c.num_experts) r.fail("num_experts_per_tok", "exceeds num_local_experts");
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-6);
  c.embedding_multiplier = r.get_double("embedding_multiplier", 1.0);
  c.residual_multiplier = r.get_double("residual_multiplier", 1.0);
  c.attention_multiplier = r.get_double("attention_multiplier", 1.0);
  c.logits_scaling = r.get_double("logits_scaling", 1.0);
  if (c.logits_scaling == 0) r.fail("logits_scaling", "must not be 0");
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.attention_bias = r.get_bool("attention_bias", false);
  c.proj_bias = r.get_bool("mamba_proj_bias", false);
  c.conv_bias = r.get_bool("mamba_conv_bias", true);
  if (r.get_string("hidden_act", "silu") != "silu") r.fail("hidden_act", "must be silu");
  const std::string position =
      r.has("position_embedding_type") && !r.get("position_embedding_type").is_null()
          ? r.get_string("position_embedding_type")
          : "none";
  if (position != "rope" && position != "none" && position != "nope") {
    r.fail("position_embedding_type", fmt::format("is '{}' (expected rope or none)", position));
  }
  c.rope = position == "rope";
  if (c.rope) c.rope_parameters = read_single_rope_parameters(r, 10000.0);
  c.mamba = read_bamba_mamba2_shape(r, read_mamba_expand_intermediate(r));
  c.mixer = read_bamba_mixer_options(r, c.rms_norm_eps);
  return c;
}

ModelSpec build_granite_spec(const ConfigReader& config) {
  const GraniteConfig c = read_granite_config(config);
  return stack_layers(
      c.kinds, {.attention = read_attention_shape(config),
                .recurrent_states = mamba2_states(c.mamba, config_dtype(config), DType::kFloat32)});
}

class GraniteModel final : public DecoderModel {
 public:
  GraniteModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
               const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_granite_config(text_config_reader())) {
    if (config_.rope)
      inv_freq_ = rope_inv_freq(config_.rope_parameters, config_.head_dim, device());
  }

  at::Tensor embed(const at::Tensor& input_ids) override {
    return embed_tokens(input_ids) * config_.embedding_multiplier;
  }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    const double eps = config_.rms_norm_eps;
    const at::Tensor x = rms_norm(hidden, layer_tensor(layer, "input_layernorm.weight"), eps,
                                  NormStyle::kScaleAfterCast);
    const bool attention_layer =
        config_.kinds[static_cast<size_t>(layer)] == LayerKind::kFullAttention;
    const at::Tensor mixed =
        attention_layer ? attention(layer, x, run) : mamba(layer, x, run.state);
    const at::Tensor h = hidden + mixed * config_.residual_multiplier;
    const at::Tensor y = rms_norm(h, layer_tensor(layer, "post_attention_layernorm.weight"), eps,
                                  NormStyle::kScaleAfterCast);
    return h + feed_forward(layer, y) * config_.residual_multiplier;
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, "model.norm.weight", config_.rms_norm_eps,
                         NormStyle::kScaleAfterCast, config_.tie_word_embeddings) /
           config_.logits_scaling;
  }

  std::vector<WeightRequirement> required_weights() const override {
    const GraniteConfig& c = config_;
    const int64_t h = c.hidden_size, inter = c.intermediate_size, e = c.num_experts;
    WeightList weights = decoder_weights(outer_weights_of(c));
    for (int64_t i = 0; i < static_cast<int64_t>(c.kinds.size()); ++i) {
      LayerWeights layer = weights.layer(i);
      if (c.kinds[static_cast<size_t>(i)] == LayerKind::kFullAttention) {
        layer.attention("self_attn.", attention_projections_of(c, c.attention_bias));
      } else {
        layer.add_all("mamba.", mamba2_weight_shapes(c.mamba, h, c.conv_bias, c.proj_bias));
      }
      if (e > 0) {
        layer.add("block_sparse_moe.router.layer.weight", {e, h});
        layer.add("block_sparse_moe.input_linear.weight", {e, 2 * inter, h});
        layer.add("block_sparse_moe.output_linear.weight", {e, h, inter});
      }
      layer.linear("shared_mlp.input_linear", 2 * c.shared_intermediate_size, h);
      layer.linear("shared_mlp.output_linear", h, c.shared_intermediate_size);
      layer.add("input_layernorm.weight", {h});
      layer.add("post_attention_layernorm.weight", {h});
    }
    return std::move(weights).take();
  }

 private:
  // The MoE (top-k of the router logits, softmax over them, SwiGLU experts) plus the shared
  // SwiGLU; without experts, the shared SwiGLU alone.
  at::Tensor feed_forward(int64_t layer, const at::Tensor& y) {
    const int64_t s = config_.shared_intermediate_size;
    const at::Tensor& shared_in = layer_tensor(layer, "shared_mlp.input_linear.weight");
    const at::Tensor& shared_out = layer_tensor(layer, "shared_mlp.output_linear.weight");
    if (config_.num_experts == 0) {
      const auto halves = arch::linear(y, shared_in).chunk(2, -1);
      return arch::linear(arch::silu(halves[0]) * halves[1], shared_out);
    }
    SparseMoeWeights w;
    w.router = layer_tensor(layer, "block_sparse_moe.router.layer.weight");
    w.shared_gate = shared_in.slice(0, 0, s);
    w.shared_up = shared_in.slice(0, s, 2 * s);
    w.shared_down = shared_out;
    w.expert = [this, layer](int64_t e) {
      ExpertWeights ew;
      ew.gate_up = layer_tensor(layer, "block_sparse_moe.input_linear.weight").select(0, e);
      ew.down = layer_tensor(layer, "block_sparse_moe.output_linear.weight").select(0, e);
      return ew;
    };
    return sparse_moe_block(y, w, config_.top_k, /*norm_topk_prob=*/false,
                            MoeRouter::kTopKThenSoftmax);
  }

  at::Tensor mamba(int64_t layer, const at::Tensor& x, LayerState* state) {
    const Mamba2Weights m = mamba2_weights(
        [&](const std::string& name) -> const at::Tensor& { return layer_tensor(layer, name); },
        "mamba.", config_.conv_bias, config_.proj_bias);
    return mamba2_mixer(config_.mamba, config_.mixer,
                        layer_linear(layer, "mamba.in_proj", x, config_.proj_bias), m, state);
  }

  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    const bool bias = config_.attention_bias;
    auto heads = [&](const char* name, int64_t n) {
      return layer_linear(layer, name, x, bias).view({batch, steps, n, hd}).transpose(1, 2);
    };
    at::Tensor q = heads("self_attn.q_proj", config_.num_heads);
    at::Tensor k = heads("self_attn.k_proj", config_.num_kv_heads);
    if (config_.rope) {
      const RotaryTable table =
          rotary_table(inv_freq_, run.position_offset, steps,
                       rope_attention_factor(config_.rope_parameters), x.scalar_type());
      q = apply_rotary(q, table);
      k = apply_rotary(k, table);
    }
    // GraniteMoeHybridAttention scales by attention_multiplier, not head_dim^-1/2.
    return attend_and_project({.layer_id = layer,
                               .q = q,
                               .k = k,
                               .v = heads("self_attn.v_proj", config_.num_kv_heads),
                               .scaling = config_.attention_multiplier},
                              run, "self_attn.o_proj", bias);
  }

  GraniteConfig config_;
  at::Tensor inv_freq_;
};

const RegisterArchitecture kRegister(
    {"granitemoehybrid", {"granitemoehybrid"}, build_granite_spec, create_model_of<GraniteModel>});

}  // namespace
}  // namespace headwise::arch

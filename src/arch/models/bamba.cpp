// Bamba (`bamba`): Mamba-2 layers with Llama attention (partial RoPE) at `attn_layer_indices`,
// a SwiGLU after every mixer. Mirrors transformers 5.17 models/bamba/modeling_bamba.py; the
// Mamba-2 mixer is arch/mamba2.
#include <algorithm>
#include <cmath>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/mamba2.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

// BambaConfig with its class defaults (transformers 5.17).
struct BambaConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, rotary_dim = 0;
  double rms_norm_eps = 1e-5, rope_theta = 10000.0;
  bool tie_word_embeddings = false, attention_bias = false, mlp_bias = false, proj_bias = false,
       conv_bias = true;
  std::vector<LayerKind> kinds;
  Mamba2Shape mamba;
  Mamba2Options mixer;
};

std::vector<LayerKind> bamba_layer_kinds(const ConfigReader& config, int64_t num_layers) {
  std::vector<int64_t> attention_layers;
  if (config.has("attn_layer_indices") && !config.get("attn_layer_indices").is_null()) {
    attention_layers = config.get_int_list("attn_layer_indices");
  }
  for (int64_t i : attention_layers) {
    if (i < 0 || i >= num_layers) {
      config.fail("attn_layer_indices",
                  fmt::format("names layer {} but the model has {} layers", i, num_layers));
    }
  }
  std::vector<LayerKind> kinds;
  for (int64_t i = 0; i < num_layers; ++i) {
    const bool attention =
        std::find(attention_layers.begin(), attention_layers.end(), i) != attention_layers.end();
    kinds.push_back(attention ? LayerKind::kFullAttention : LayerKind::kMamba);
  }
  return kinds;
}

// The rope object's (or top-level) theta and partial_rotary_factor (BambaConfig default 0.5).
void read_bamba_rope(const ConfigReader& r, BambaConfig& c) {
  double partial = r.get_double("partial_rotary_factor", 0.5);
  c.rope_theta = r.get_double("rope_theta", 10000.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!r.has(key) || r.get(key).is_null()) continue;
    const ConfigReader sub(r.get(key), fmt::format("{}: field '{}'", r.where(), key));
    const std::string type =
        sub.has("rope_type") ? sub.get_string("rope_type") : sub.get_string("type", "default");
    if (type != "default")
      throw_unsupported("{}: field '{}.rope_type' is '{}'; bamba supports 'default'", r.where(),
                        key, type);
    c.rope_theta = sub.get_double("rope_theta", c.rope_theta);
    partial = sub.get_double("partial_rotary_factor", partial);
  }
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim) {
    r.fail("partial_rotary_factor",
           fmt::format("gives rotary dim {} for head_dim {}", c.rotary_dim, c.head_dim));
  }
}

BambaConfig read_bamba_config(const ConfigReader& r) {
  BambaConfig c;
  c.vocab_size = r.get_positive_int("vocab_size", 128000);
  c.hidden_size = r.get_positive_int("hidden_size", 4096);
  c.intermediate_size = r.get_positive_int("intermediate_size", 14336);
  c.num_layers = r.get_positive_int("num_hidden_layers", 32);
  c.num_heads = r.get_positive_int("num_attention_heads", 32);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", 8);
  c.head_dim = r.get_positive_int("head_dim", c.hidden_size / c.num_heads);
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-5);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.attention_bias = r.get_bool("attention_bias", false);
  c.mlp_bias = r.get_bool("mlp_bias", false);
  c.proj_bias = r.get_bool("mamba_proj_bias", false);
  c.conv_bias = r.get_bool("mamba_conv_bias", true);
  if (r.get_string("hidden_act", "silu") != "silu") r.fail("hidden_act", "must be silu");
  c.kinds = bamba_layer_kinds(r, c.num_layers);
  read_bamba_rope(r, c);
  c.mamba = read_bamba_mamba2_shape(r, read_mamba_expand_intermediate(r));
  c.mixer = read_bamba_mixer_options(r, c.rms_norm_eps);
  return c;
}

ModelSpec build_bamba_spec(const ConfigReader& config) {
  const BambaConfig c = read_bamba_config(config);
  const AttentionShape attention = read_attention_shape(config);
  // The torch scan returns float32 final states and the cache keeps them (checked in 5.17).
  return stack_layers(
      c.num_layers, [&](int64_t i) { return c.kinds[static_cast<size_t>(i)]; },
      {.attention = attention,
       .recurrent_states = mamba2_states(c.mamba, config_dtype(config), DType::kFloat32)});
}

class BambaModel final : public DecoderModel {
 public:
  BambaModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
             const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_bamba_config(text_config_reader())),
        inv_freq_(default_inv_freq(config_.rope_theta, config_.rotary_dim, device())) {}

  at::Tensor embed(const at::Tensor& input_ids) override { return embed_tokens(input_ids); }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    const bool attention_layer =
        config_.kinds[static_cast<size_t>(layer)] == LayerKind::kFullAttention;
    return pre_norm_residual(
        hidden, layer_tensor(layer, "input_layernorm.weight"),
        layer_tensor(layer, "pre_ff_layernorm.weight"), config_.rms_norm_eps,
        NormStyle::kScaleAfterCast,
        [&](const at::Tensor& x) {
          return attention_layer ? attention(layer, x, run) : mamba(layer, x, run.state);
        },
        [&](const at::Tensor& y) {
          const at::Tensor gate =
              layer_linear(layer, "feed_forward.gate_proj", y, config_.mlp_bias);
          const at::Tensor up = layer_linear(layer, "feed_forward.up_proj", y, config_.mlp_bias);
          return layer_linear(layer, "feed_forward.down_proj", arch::silu(gate) * up,
                              config_.mlp_bias);
        });
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, "model.final_layernorm.weight", config_.rms_norm_eps,
                         NormStyle::kScaleAfterCast, config_.tie_word_embeddings);
  }

  std::vector<WeightRequirement> required_weights() const override {
    const BambaConfig& c = config_;
    const int64_t h = c.hidden_size;
    WeightList weights = decoder_weights(outer_weights_of(c, "model.final_layernorm.weight"));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights layer = weights.layer(i);
      if (c.kinds[static_cast<size_t>(i)] == LayerKind::kFullAttention) {
        layer.attention("self_attn.", attention_projections_of(c, c.attention_bias));
      } else {
        layer.add_all("mamba.", mamba2_weight_shapes(c.mamba, h, c.conv_bias, c.proj_bias));
      }
      layer.gated_mlp("feed_forward.", h, c.intermediate_size, c.mlp_bias);
      layer.add("input_layernorm.weight", {h});
      layer.add("pre_ff_layernorm.weight", {h});
    }
    return std::move(weights).take();
  }

 private:
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
    const RotaryTable table =
        rotary_table(inv_freq_, run.position_offset, steps, 1.0, x.scalar_type());
    return attend_and_project(
        {.layer_id = layer,
         .q = apply_rotary(heads("self_attn.q_proj", config_.num_heads), table),
         .k = apply_rotary(heads("self_attn.k_proj", config_.num_kv_heads), table),
         .v = heads("self_attn.v_proj", config_.num_kv_heads),
         .scaling = std::pow(static_cast<double>(hd), -0.5)},
        run, "self_attn.o_proj", bias);
  }

  BambaConfig config_;
  at::Tensor inv_freq_;
};

const RegisterArchitecture kRegister(
    {"bamba", {"bamba"}, build_bamba_spec, create_model_of<BambaModel>});

}  // namespace
}  // namespace headwise::arch

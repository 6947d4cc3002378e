// Falcon-H1 (`falcon_h1`): every layer runs a Mamba-2 mixer and global attention in parallel on
// the same normed input, so every layer is a global layer (its KV heads take windows) that also
// keeps conv + SSM states. Mirrors transformers 5.17 models/falcon_h1/modeling_falcon_h1.py with
// its muP multipliers: embeddings x embedding_multiplier; the mixer's input x ssm_in_multiplier
// and its in_proj output x a per-section vector (ssm_multipliers for z, x, B, C, dt), its output x
// ssm_out_multiplier; attention's input x attention_in_multiplier, keys x key_multiplier, output x
// attention_out_multiplier; the MLP's gate x mlp_multipliers[0] and output x [1]; logits x
// lm_head_multiplier. The mixer's gate goes before or after a grouped norm, or alone.
#include <cmath>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/mamba2.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/rope_params.hpp"
#include "headwise/arch/state_shapes.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

Mamba2Shape falcon_mamba_shape(const ConfigReader& config) {
  // FalconH1Config: mamba_d_ssm defaults to 1024 when absent; an explicit null means expand *
  // hidden.
  int64_t intermediate = 0;
  if (!config.json().contains("mamba_d_ssm")) {
    intermediate = 1024;
  } else if (config.has("mamba_d_ssm")) {
    intermediate = config.get_positive_int("mamba_d_ssm");
  } else {
    intermediate = read_mamba_expand_intermediate(config);
  }
  return read_bamba_mamba2_shape(config, intermediate);
}

ModelSpec build_falcon_h1_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  const AttentionShape attention = read_attention_shape(config);
  const Mamba2Shape mamba = falcon_mamba_shape(config);
  const DType dtype = config_dtype(config);
  // Attention's KV grows with context, so each layer counts as full attention; the Mamba-2
  // mixer beside it adds its states to the same layer.
  ModelSpec spec = stack_layers(
      std::vector<LayerKind>(static_cast<size_t>(num_layers), LayerKind::kFullAttention),
      {.attention = attention});
  for (LayerSpec& layer : spec.layers) layer.states = mamba2_states(mamba, dtype, DType::kFloat32);
  return spec;
}

// A list field of `n` numbers, or `fallback` when absent.
std::vector<double> number_list(const ConfigReader& r, const char* key,
                                std::vector<double> fallback) {
  if (!r.has(key) || r.get(key).is_null()) return fallback;
  const auto& list = r.get(key);
  if (!list.is_array() || list.size() != fallback.size()) {
    r.fail(key, fmt::format("must be a list of {} numbers", fallback.size()));
  }
  std::vector<double> out;
  for (const auto& v : list) {
    if (!v.is_number()) r.fail(key, fmt::format("must be a list of {} numbers", fallback.size()));
    out.push_back(v.get<double>());
  }
  return out;
}

// FalconH1Config with its class defaults (transformers 5.17).
struct FalconConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double rms_norm_eps = 1e-5, embedding_multiplier = 1, lm_head_multiplier = 1, attention_in = 1,
         attention_out = 1, key_multiplier = 1, ssm_in = 1, ssm_out = 1;
  std::vector<double> mlp_multipliers, ssm_multipliers;
  bool tie_word_embeddings = false, attention_bias = false, mlp_bias = false, in_proj_bias = false,
       out_proj_bias = false, conv_bias = true, rms_norm = true;
  RopeParameters rope;
  Mamba2Shape mamba;
  Mamba2Options mixer;
};

FalconConfig read_falcon_config(const ConfigReader& r) {
  FalconConfig c;
  c.vocab_size = r.get_positive_int("vocab_size", 128000);
  c.hidden_size = r.get_positive_int("hidden_size", 4096);
  c.intermediate_size = r.get_positive_int("intermediate_size", 14336);
  c.num_layers = r.get_positive_int("num_hidden_layers", 32);
  c.num_heads = r.get_positive_int("num_attention_heads", 32);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", 8);
  c.head_dim = r.has("head_dim") && !r.get("head_dim").is_null() ? r.get_positive_int("head_dim")
                                                                 : c.hidden_size / c.num_heads;
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-5);
  c.embedding_multiplier = r.get_double("embedding_multiplier", 1.0);
  c.lm_head_multiplier = r.get_double("lm_head_multiplier", 1.0);
  c.attention_in = r.get_double("attention_in_multiplier", 1.0);
  c.attention_out = r.get_double("attention_out_multiplier", 1.0);
  c.key_multiplier = r.get_double("key_multiplier", 1.0);
  c.ssm_in = r.get_double("ssm_in_multiplier", 1.0);
  c.ssm_out = r.get_double("ssm_out_multiplier", 1.0);
  c.mlp_multipliers = number_list(r, "mlp_multipliers", {1.0, 1.0});
  c.ssm_multipliers = number_list(r, "ssm_multipliers", {1.0, 1.0, 1.0, 1.0, 1.0});
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.attention_bias = r.get_bool("attention_bias", false);
  c.mlp_bias = r.get_bool("mlp_bias", false);
  c.in_proj_bias = r.get_bool("mamba_proj_bias", false);
  c.out_proj_bias = r.get_bool("projectors_bias", false);
  c.conv_bias = r.get_bool("mamba_conv_bias", true);
  c.rms_norm = r.get_bool("mamba_rms_norm", false);
  if (r.get_string("hidden_act", "silu") != "silu") r.fail("hidden_act", "must be silu");
  c.rope = read_single_rope_parameters(r, 10000.0);
  c.mamba = falcon_mamba_shape(r);
  c.mixer = read_bamba_mixer_options(r, c.rms_norm_eps);
  c.mixer.norm_groups = c.mamba.groups;
  c.mixer.gate = !c.rms_norm                                  ? Mamba2Options::Gate::kWithoutNorm
                 : r.get_bool("mamba_norm_before_gate", true) ? Mamba2Options::Gate::kAfterNorm
                                                              : Mamba2Options::Gate::kThenNorm;
  return c;
}

class FalconH1Model final : public DecoderModel {
 public:
  FalconH1Model(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
                const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_falcon_config(text_config_reader())),
        inv_freq_(rope_inv_freq(config_.rope, config_.head_dim, device())),
        mup_vector_(mup_vector()) {}

  at::Tensor embed(const at::Tensor& input_ids) override {
    return embed_tokens(input_ids) * config_.embedding_multiplier;
  }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    return pre_norm_residual(
        hidden, layer_tensor(layer, "input_layernorm.weight"),
        layer_tensor(layer, "pre_ff_layernorm.weight"), config_.rms_norm_eps,
        NormStyle::kScaleAfterCast,
        [&](const at::Tensor& x) {
          const at::Tensor ssm = mamba(layer, x, run.state) * config_.ssm_out;
          return ssm + attention(layer, x * config_.attention_in, run) * config_.attention_out;
        },
        [&](const at::Tensor& y) {
          // FalconH1MLP: down(up(y) * silu(gate(y) * m0)) * m1.
          const at::Tensor gate =
              layer_linear(layer, "feed_forward.gate_proj", y, config_.mlp_bias);
          const at::Tensor up = layer_linear(layer, "feed_forward.up_proj", y, config_.mlp_bias);
          return layer_linear(layer, "feed_forward.down_proj",
                              up * arch::silu(gate * config_.mlp_multipliers[0]),
                              config_.mlp_bias) *
                 config_.mlp_multipliers[1];
        });
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, "model.final_layernorm.weight", config_.rms_norm_eps,
                         NormStyle::kScaleAfterCast, config_.tie_word_embeddings) *
           config_.lm_head_multiplier;
  }

  std::vector<WeightRequirement> required_weights() const override {
    const FalconConfig& c = config_;
    const int64_t h = c.hidden_size;
    WeightList weights = decoder_weights(outer_weights_of(c, "model.final_layernorm.weight"));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights layer = weights.layer(i);
      layer.attention("self_attn.", attention_projections_of(c, c.attention_bias));
      layer.add_all("mamba.", mamba2_weight_shapes(c.mamba, h, c.conv_bias, c.in_proj_bias,
                                                   c.rms_norm, c.out_proj_bias));
      layer.gated_mlp("feed_forward.", h, c.intermediate_size, c.mlp_bias);
      layer.add("input_layernorm.weight", {h});
      layer.add("pre_ff_layernorm.weight", {h});
    }
    return std::move(weights).take();
  }

 private:
  // compute_mup_vector: [z (I) | x (I) | B (G*N) | C (G*N) | dt (H)], each section x its
  // multiplier.
  at::Tensor mup_vector() const {
    const Mamba2Shape& m = config_.mamba;
    const int64_t gn = m.groups * m.state_size;
    const std::vector<int64_t> sections{m.intermediate, m.intermediate, gn, gn, m.heads};
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < sections.size(); ++i) {
      parts.push_back(at::full({sections[i]}, config_.ssm_multipliers[i],
                               at::TensorOptions().dtype(at::kFloat)));
    }
    return at::cat(parts).to(device());
  }

  at::Tensor mamba(int64_t layer, const at::Tensor& x, LayerState* state) {
    const Mamba2Weights m = mamba2_weights(
        [&](const std::string& name) -> const at::Tensor& { return layer_tensor(layer, name); },
        "mamba.", config_.conv_bias, config_.out_proj_bias, config_.rms_norm);
    // HF builds the muP buffer in the model's dtype (its multipliers rounded to bf16 in a bf16
    // run).
    const at::Tensor projected =
        layer_linear(layer, "mamba.in_proj", x * config_.ssm_in, config_.in_proj_bias) *
        mup_vector_.to(x.scalar_type());
    return mamba2_mixer(config_.mamba, config_.mixer, projected, m, state);
  }

  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    const bool bias = config_.attention_bias;
    auto heads = [&](const char* name, int64_t n) {
      return layer_linear(layer, name, x, bias).view({batch, steps, n, hd}).transpose(1, 2);
    };
    const RotaryTable table = rotary_table(inv_freq_, run.position_offset, steps,
                                           rope_attention_factor(config_.rope), x.scalar_type());
    return attend_and_project(
        {.layer_id = layer,
         .q = apply_rotary(heads("self_attn.q_proj", config_.num_heads), table),
         .k = apply_rotary(heads("self_attn.k_proj", config_.num_kv_heads) * config_.key_multiplier,
                           table),
         .v = heads("self_attn.v_proj", config_.num_kv_heads),
         .scaling = std::pow(static_cast<double>(hd), -0.5)},
        run, "self_attn.o_proj", bias);
  }

  FalconConfig config_;
  at::Tensor inv_freq_;
  at::Tensor mup_vector_;
};

const RegisterArchitecture kRegister(
    {"falcon_h1", {"falcon_h1"}, build_falcon_h1_spec, create_model_of<FalconH1Model>});

}  // namespace
}  // namespace headwise::arch

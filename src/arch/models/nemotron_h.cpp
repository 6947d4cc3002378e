// NemotronH (`nemotron_h`): one mixer per block — Mamba-2, attention (no RoPE), MLP or MoE — by
// `layer_types` / `layers_block_type` (transformers 5) or the Hub's `hybrid_override_pattern`
// (M mamba, * attention, - MLP, E MoE). Mirrors transformers 5.17
// models/nemotron_h/modeling_nemotron_h.py for M, * and - blocks (the Mamba-2 mixer is
// arch/mamba2, its gated norm over groups of intermediate / n_groups); configs with MoE blocks
// are read for memory estimates, and their forward is refused naming the block.
#include <cmath>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/mamba2.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {
namespace {

enum class Block { kMamba, kAttention, kMlp, kMoe };

Block block_of(const ConfigReader& config, std::string_view key, const std::string& type) {
  if (type == "M" || type == "mamba" || type == "linear_attention") return Block::kMamba;
  if (type == "*" || type == "attention" || type == "full_attention") return Block::kAttention;
  if (type == "-" || type == "mlp") return Block::kMlp;
  if (type == "E" || type == "moe") return Block::kMoe;
  config.fail(
      key,
      fmt::format("has unknown block type '{}' (expected M, *, -, E or their long names)", type));
}

std::vector<Block> read_blocks(const ConfigReader& config) {
  std::vector<Block> blocks;
  for (const char* key : {"layer_types", "layers_block_type"}) {
    if (!config.has(key) || config.get(key).is_null()) continue;
    for (const auto& type : config.get_string_list(key))
      blocks.push_back(block_of(config, key, type));
    return blocks;
  }
  const std::string pattern = config.get_string("hybrid_override_pattern");
  for (char c : pattern)
    blocks.push_back(block_of(config, "hybrid_override_pattern", std::string(1, c)));
  if (blocks.empty()) config.fail("hybrid_override_pattern", "is empty");
  return blocks;
}

LayerKind kind_of(Block b) {
  switch (b) {
    case Block::kMamba:
      return LayerKind::kMamba;
    case Block::kAttention:
      return LayerKind::kFullAttention;
    default:
      return LayerKind::kMlpOnly;
  }
}

// Accepts the legacy (mamba_*) names NemotronHConfig still maps.
int64_t int_field(const ConfigReader& config, std::string_view key, std::string_view legacy,
                  int64_t fallback) {
  if (config.has(key)) return config.get_positive_int(key);
  return config.get_positive_int(legacy, fallback);
}

bool bool_field(const ConfigReader& config, std::string_view key, std::string_view legacy,
                bool fallback) {
  if (config.has(key)) return config.get_bool(key, fallback);
  return config.get_bool(legacy, fallback);
}

// NemotronHConfig with its class defaults (transformers 5.17).
struct NemotronHConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  double eps = 1e-5;
  bool tie_word_embeddings = false, mlp_bias = false, proj_bias = false, conv_bias = true;
  std::vector<Block> blocks;
  Mamba2Shape mamba;
  Mamba2Options mixer;
  DType ssm_dtype = DType::kFloat32;
};

NemotronHConfig read_nemotron_h_config(const ConfigReader& r) {
  NemotronHConfig c;
  c.blocks = read_blocks(r);
  c.vocab_size = r.get_positive_int("vocab_size", 131072);
  c.hidden_size = r.get_positive_int("hidden_size", 4096);
  c.intermediate_size = r.get_positive_int("intermediate_size", 21504);
  c.num_heads = r.get_positive_int("num_attention_heads", 32);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", 8);
  c.head_dim = r.get_positive_int("head_dim", 128);  // NemotronHConfig default, not hidden / heads
  c.eps = r.get_double("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.mlp_bias = r.get_bool("mlp_bias", false);
  c.proj_bias = bool_field(r, "use_bias", "mamba_proj_bias", false);
  c.conv_bias = r.get_bool("use_conv_bias", true);
  c.mamba.heads = r.get_positive_int("mamba_num_heads", 128);
  c.mamba.head_dim = r.get_positive_int("mamba_head_dim", 64);
  c.mamba.intermediate = c.mamba.heads * c.mamba.head_dim;
  c.mamba.groups = int_field(r, "n_groups", "mamba_n_groups", 8);
  c.mamba.state_size = r.get_positive_int("ssm_state_size", 128);
  c.mamba.conv_kernel = int_field(r, "conv_kernel", "mamba_d_conv", 4);
  validate_mamba2(c.mamba, r);
  c.mixer.chunk_size = int_field(r, "chunk_size", "mamba_chunk_size", 128);
  c.mixer.dt_min =
      r.get_double("time_step_min", 0.001);  // NemotronHMamba2Mixer: (time_step_min, inf)
  c.mixer.norm_eps = c.eps;
  c.mixer.norm_groups = c.mamba.groups;
  // The config declares the SSM cache dtype (default float32, what the scan returns anyway).
  c.ssm_dtype = parse_dtype(r.get_string("mamba_ssm_cache_dtype", "float32"),
                            fmt::format("{}: field 'mamba_ssm_cache_dtype'", r.where()));
  return c;
}

ModelSpec build_nemotron_h_spec(const ConfigReader& config) {
  const NemotronHConfig c = read_nemotron_h_config(config);
  AttentionShape attention = read_attention_shape(config);
  attention.head_dim = c.head_dim;
  std::vector<LayerKind> kinds;
  for (Block b : c.blocks) kinds.push_back(kind_of(b));
  return stack_layers(
      kinds, {.attention = attention,
              .recurrent_states = mamba2_states(c.mamba, config_dtype(config), c.ssm_dtype)});
}

class NemotronHModel final : public DecoderModel {
 public:
  NemotronHModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
                 const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_nemotron_h_config(text_config_reader())),
        // Hub checkpoints keep the Mamba naming ("backbone."); transformers' own layout is
        // "model.".
        prefix_(this->checkpoint().contains("backbone.embeddings.weight") ? "backbone."
                                                                          : "model.") {
    for (size_t i = 0; i < config_.blocks.size(); ++i) {
      if (config_.blocks[i] == Block::kMoe) {
        throw_unsupported(
            "{}: block {} is a MoE block (E); the nemotron_h forward covers Mamba-2, attention and "
            "MLP "
            "blocks (mem-estimate and inspect work for this config)",
            this->checkpoint().dir().string(), i);
      }
    }
  }

  at::Tensor embed(const at::Tensor& input_ids) override {
    return embed_tokens(input_ids, prefix_ + "embeddings.weight");
  }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    const at::Tensor x = rms_norm(hidden, layer_tensor(layer, "norm.weight", prefix_), config_.eps,
                                  NormStyle::kScaleAfterCast);
    switch (config_.blocks[static_cast<size_t>(layer)]) {
      case Block::kMamba:
        return hidden + mamba(layer, x, run.state);
      case Block::kAttention:
        return hidden + attention(layer, x, run);
      default: {
        // NemotronHMLP: down(relu(up(x))^2).
        const at::Tensor up = layer_linear(layer, "mixer.up_proj", x, config_.mlp_bias, prefix_);
        return hidden + layer_linear(layer, "mixer.down_proj", at::relu(up).pow(2),
                                     config_.mlp_bias, prefix_);
      }
    }
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, prefix_ + "norm_f.weight", config_.eps, NormStyle::kScaleAfterCast,
                         config_.tie_word_embeddings, prefix_ + "embeddings.weight");
  }

  std::vector<WeightRequirement> required_weights() const override {
    const NemotronHConfig& c = config_;
    const int64_t h = c.hidden_size;
    WeightList weights = decoder_weights({.vocab_size = c.vocab_size,
                                          .hidden_size = h,
                                          .tied = c.tie_word_embeddings,
                                          .embedding = prefix_ + "embeddings.weight",
                                          .final_norm = prefix_ + "norm_f.weight"},
                                         prefix_);
    for (int64_t i = 0; i < static_cast<int64_t>(c.blocks.size()); ++i) {
      LayerWeights layer = weights.layer(i);
      layer.add("norm.weight", {h});
      switch (c.blocks[static_cast<size_t>(i)]) {
        case Block::kMamba:
          layer.add_all("mixer.", mamba2_weight_shapes(c.mamba, h, c.conv_bias, c.proj_bias));
          break;
        case Block::kAttention:
          layer.attention("mixer.", attention_projections_of(c));
          break;
        default:
          layer.linear("mixer.up_proj", c.intermediate_size, h, c.mlp_bias);
          layer.linear("mixer.down_proj", h, c.intermediate_size, c.mlp_bias);
      }
    }
    return std::move(weights).take();
  }

 private:
  at::Tensor mamba(int64_t layer, const at::Tensor& x, LayerState* state) {
    const Mamba2Weights m = mamba2_weights(
        [&](const std::string& name) -> const at::Tensor& {
          return layer_tensor(layer, name, prefix_);
        },
        "mixer.", config_.conv_bias, config_.proj_bias);
    return mamba2_mixer(config_.mamba, config_.mixer,
                        layer_linear(layer, "mixer.in_proj", x, config_.proj_bias, prefix_), m,
                        state);
  }

  // NemotronHAttention: GQA without positional encoding.
  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    auto heads = [&](const char* name, int64_t n) {
      return layer_linear(layer, name, x, false, prefix_)
          .view({batch, steps, n, hd})
          .transpose(1, 2);
    };
    return attend_and_project({.layer_id = layer,
                               .q = heads("mixer.q_proj", config_.num_heads),
                               .k = heads("mixer.k_proj", config_.num_kv_heads),
                               .v = heads("mixer.v_proj", config_.num_kv_heads),
                               .scaling = std::pow(static_cast<double>(hd), -0.5)},
                              run, "mixer.o_proj", false, prefix_);
  }

  NemotronHConfig config_;
  std::string prefix_;
};

const RegisterArchitecture kRegister(
    {"nemotron_h", {"nemotron_h"}, build_nemotron_h_spec, create_model_of<NemotronHModel>});

}  // namespace
}  // namespace headwise::arch

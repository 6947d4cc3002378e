// LFM2 (`lfm2`): gated short-convolution layers and full attention layers. Mirrors transformers
// 5.17 models/lfm2/modeling_lfm2.py: a conv layer projects to B, C, x, convolves B*x depthwise
// and causally over conv_L_cache tokens, and gates the result with C; attention has per-head
// q/k RMSNorms before RoPE; every layer ends in a SwiGLU (w1, w3, w2). The conv state is
// (hidden, conv_L_cache) in the model dtype: the last inputs of the convolution.
#include <algorithm>
#include <cmath>

#include "headwise/arch/gated_delta.hpp"
#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/rope_params.hpp"
#include "headwise/arch/state_shapes.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

std::vector<std::string> lfm2_layer_types(const ConfigReader& config, int64_t num_layers) {
  if (config.has("layer_types")) return read_layer_types(config, "layer_types", num_layers);
  // Legacy configs list the attention layers; Lfm2Config's default is all attention.
  std::vector<int64_t> full(static_cast<size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) full[static_cast<size_t>(i)] = i;
  if (config.has("full_attn_idxs")) full = config.get_int_list("full_attn_idxs");
  std::vector<std::string> types;
  for (int64_t i = 0; i < num_layers; ++i) {
    types.push_back(std::find(full.begin(), full.end(), i) != full.end() ? "full_attention"
                                                                         : "conv");
  }
  return types;
}

std::vector<LayerKind> lfm2_layer_kinds(const ConfigReader& config, int64_t num_layers) {
  const std::vector<std::string> types = lfm2_layer_types(config, num_layers);
  std::vector<LayerKind> kinds;
  for (int64_t i = 0; i < num_layers; ++i) {
    kinds.push_back(
        layer_kind_of_type(config, types[static_cast<size_t>(i)], i,
                           {{"full_attention", LayerKind::kFullAttention},
                            {"conv", LayerKind::kShortConv},
                            {"linear_attention", LayerKind::kShortConv}}));  // 5.x remaps "conv"
  }
  return kinds;
}

ModelSpec build_lfm2_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  const std::vector<LayerKind> kinds = lfm2_layer_kinds(config, num_layers);
  const AttentionShape attention = read_attention_shape(config);
  const int64_t hidden = config.get_positive_int("hidden_size");
  const int64_t l_cache = config.get_positive_int("conv_L_cache", 3);
  const DType dtype = config_dtype(config);
  return stack_layers(
      num_layers, [&](int64_t i) { return kinds[static_cast<size_t>(i)]; },
      {.attention = attention, .recurrent_states = short_conv_states(hidden, l_cache, dtype)});
}

// Lfm2Config with its class defaults.
struct Lfm2Config {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_layers = 0;
  int64_t num_heads = 0, num_kv_heads = 0, head_dim = 0, conv_kernel = 3;
  double norm_eps = 1e-5;
  bool conv_bias = false, tie_word_embeddings = true;
  std::vector<LayerKind> kinds;
  RopeParameters rope;
};

// Lfm2MLP's width: 2/3 of intermediate_size, times block_ffn_dim_multiplier, rounded up to
// block_multiple_of, when block_auto_adjust_ff_dim.
int64_t lfm2_ffn_width(const ConfigReader& r) {
  int64_t width = r.get_positive_int("intermediate_size", 12288);
  if (!r.get_bool("block_auto_adjust_ff_dim", true)) return width;
  width = static_cast<int64_t>(2.0 * static_cast<double>(width) / 3.0);
  if (r.has("block_ffn_dim_multiplier") && !r.get("block_ffn_dim_multiplier").is_null()) {
    const int64_t multiple = r.get_positive_int("block_multiple_of", 256);
    width =
        static_cast<int64_t>(r.get_double("block_ffn_dim_multiplier") * static_cast<double>(width));
    width = multiple * ((width + multiple - 1) / multiple);
  }
  if (width <= 0)
    r.fail("intermediate_size", "gives an empty feed-forward after block_auto_adjust_ff_dim");
  return width;
}

Lfm2Config read_lfm2_config(const ConfigReader& r) {
  Lfm2Config c;
  c.vocab_size = r.get_positive_int("vocab_size", 65536);
  c.hidden_size = r.get_positive_int("hidden_size", 2560);
  c.intermediate_size = lfm2_ffn_width(r);
  c.num_layers = r.get_positive_int("num_hidden_layers", 32);
  c.num_heads = r.get_positive_int("num_attention_heads", 32);
  c.num_kv_heads = r.get_positive_int("num_key_value_heads", 8);
  if (c.hidden_size % c.num_heads != 0) r.fail("num_attention_heads", "must divide hidden_size");
  c.head_dim = c.hidden_size / c.num_heads;  // Lfm2Attention
  c.conv_kernel = r.get_positive_int("conv_L_cache", 3);
  c.norm_eps = r.get_double("norm_eps", 1e-5);
  c.conv_bias = r.get_bool("conv_bias", false);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", true);
  c.kinds = lfm2_layer_kinds(r, c.num_layers);
  c.rope = read_single_rope_parameters(r, 1e6);
  return c;
}

class Lfm2Model final : public DecoderModel {
 public:
  Lfm2Model(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
            const ModelOptions& options)
      : DecoderModel(std::move(spec), std::move(checkpoint), options),
        config_(read_lfm2_config(text_config_reader())),
        inv_freq_(rope_inv_freq(config_.rope, config_.head_dim, device())) {}

  at::Tensor embed(const at::Tensor& input_ids) override { return embed_tokens(input_ids); }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override {
    const bool attention_layer =
        config_.kinds[static_cast<size_t>(layer)] == LayerKind::kFullAttention;
    return pre_norm_residual(
        hidden, layer_tensor(layer, "operator_norm.weight"), layer_tensor(layer, "ffn_norm.weight"),
        config_.norm_eps, NormStyle::kScaleAfterCast,
        [&](const at::Tensor& x) {
          return attention_layer ? attention(layer, x, run) : short_conv(layer, x, run.state);
        },
        [&](const at::Tensor& y) {
          return gated_mlp(y, layer_tensor(layer, "feed_forward.w1.weight"),
                           layer_tensor(layer, "feed_forward.w3.weight"),
                           layer_tensor(layer, "feed_forward.w2.weight"));
        });
  }

  at::Tensor logits(const at::Tensor& hidden) override {
    return norm_and_head(hidden, "model.embedding_norm.weight", config_.norm_eps,
                         NormStyle::kScaleAfterCast, config_.tie_word_embeddings);
  }

  std::vector<WeightRequirement> required_weights() const override {
    const Lfm2Config& c = config_;
    const int64_t h = c.hidden_size, inter = c.intermediate_size;
    WeightList weights = decoder_weights(outer_weights_of(c, "model.embedding_norm.weight"));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      LayerWeights layer = weights.layer(i);
      if (c.kinds[static_cast<size_t>(i)] == LayerKind::kFullAttention) {
        layer.attention("self_attn.", attention_projections_of(c, /*bias=*/false, "out_proj"));
        layer.add("self_attn.q_layernorm.weight", {c.head_dim});
        layer.add("self_attn.k_layernorm.weight", {c.head_dim});
      } else {
        layer.add("conv.in_proj.weight", {3 * h, h});
        layer.add("conv.conv.weight", {h, 1, c.conv_kernel});
        layer.add("conv.out_proj.weight", {h, h});
        // The biases come after all three weights in this family's list.
        if (c.conv_bias) {
          layer.add("conv.in_proj.bias", {3 * h});
          layer.add("conv.conv.bias", {h});
          layer.add("conv.out_proj.bias", {h});
        }
      }
      layer.linear("feed_forward.w1", inter, h);
      layer.linear("feed_forward.w3", inter, h);
      layer.linear("feed_forward.w2", h, inter);
      layer.add("operator_norm.weight", {h});
      layer.add("ffn_norm.weight", {h});
    }
    return std::move(weights).take();
  }

 private:
  // Lfm2ShortConv: [B, C, x] = in_proj(x) over channels; y = C * causal_conv(B * x); out_proj(y).
  at::Tensor short_conv(int64_t layer, const at::Tensor& x, LayerState* state) {
    const int64_t batch = x.size(0), h = config_.hidden_size;
    const auto bcx =
        layer_linear(layer, "conv.in_proj", x, config_.conv_bias).transpose(-1, -2).chunk(3, -2);
    at::Tensor conv_state = find_layer_state(state, "conv_state", {batch, h, config_.conv_kernel});
    const at::Tensor conv_bias =
        config_.conv_bias ? layer_tensor(layer, "conv.conv.bias") : at::Tensor();
    const at::Tensor conv_out =
        causal_conv1d(bcx[0] * bcx[2], layer_tensor(layer, "conv.conv.weight"), conv_bias,
                      state != nullptr ? &conv_state : nullptr)
            .to(x.scalar_type());
    if (state != nullptr) store_layer_state(*state, "conv_state", conv_state);
    return layer_linear(layer, "conv.out_proj", (bcx[1] * conv_out).transpose(-1, -2).contiguous(),
                        config_.conv_bias);
  }

  at::Tensor attention(int64_t layer, const at::Tensor& x, const LayerRun& run) {
    const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
    auto heads = [&](const char* name, int64_t n) {
      return layer_linear(layer, fmt::format("self_attn.{}", name), x, false)
          .view({batch, steps, n, hd});
    };
    const at::Tensor q = rms_norm(heads("q_proj", config_.num_heads),
                                  layer_tensor(layer, "self_attn.q_layernorm.weight"),
                                  config_.norm_eps, NormStyle::kScaleAfterCast);
    const at::Tensor k = rms_norm(heads("k_proj", config_.num_kv_heads),
                                  layer_tensor(layer, "self_attn.k_layernorm.weight"),
                                  config_.norm_eps, NormStyle::kScaleAfterCast);
    const RotaryTable table = rotary_table(inv_freq_, run.position_offset, steps,
                                           rope_attention_factor(config_.rope), q.scalar_type());
    return attend_and_project({.layer_id = layer,
                               .q = apply_rotary(q.transpose(1, 2), table),
                               .k = apply_rotary(k.transpose(1, 2), table),
                               .v = heads("v_proj", config_.num_kv_heads).transpose(1, 2),
                               .scaling = std::pow(static_cast<double>(hd), -0.5)},
                              run, "self_attn.out_proj", false);
  }

  Lfm2Config config_;
  at::Tensor inv_freq_;
};

const RegisterArchitecture kRegister(
    {"lfm2", {"lfm2"}, build_lfm2_spec, create_model_of<Lfm2Model>});

}  // namespace
}  // namespace headwise::arch

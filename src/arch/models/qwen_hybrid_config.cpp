#include "headwise/arch/qwen_hybrid_config.hpp"

#include <nlohmann/json.hpp>

#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

// layer_types, accepting HF's legacy aliases ("attention", "mamba"); else the
// full_attention_interval pattern HF derives when the list is absent.
std::vector<LayerKind> read_layer_kinds(const ConfigReader& reader, int64_t num_layers) {
  std::vector<LayerKind> kinds;
  if (reader.has("layer_types")) {
    const auto names = reader.get_string_list("layer_types");
    if (static_cast<int64_t>(names.size()) != num_layers) {
      reader.fail("layer_types", fmt::format("has {} entries but num_hidden_layers is {}",
                                             names.size(), num_layers));
    }
    for (const auto& name : names) {
      if (name == "full_attention" || name == "attention") {
        kinds.push_back(LayerKind::kFullAttention);
      } else if (name == "linear_attention" || name == "mamba") {
        kinds.push_back(LayerKind::kLinearAttention);
      } else {
        reader.fail("layer_types",
                    fmt::format("has '{}'; expected linear_attention or full_attention", name));
      }
    }
    return kinds;
  }
  const int64_t interval = reader.get_positive_int("full_attention_interval", 4);
  for (int64_t i = 0; i < num_layers; ++i) {
    kinds.push_back((i + 1) % interval == 0 ? LayerKind::kFullAttention
                                            : LayerKind::kLinearAttention);
  }
  return kinds;
}

// v5 keeps rope in `rope_parameters`; older configs put rope_theta / partial_rotary_factor at the
// top level (and maybe a `rope_scaling` of type "default"). HF fills a missing factor with 0.25.
void read_rope(const ConfigReader& reader, QwenHybridConfig& config) {
  config.rope_theta = reader.get_double("rope_theta", 10000.0);
  config.partial_rotary_factor = reader.get_double("partial_rotary_factor", 0.25);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!reader.has(key)) continue;
    const auto& params = reader.get(key);
    if (!params.is_object()) reader.fail(key, "must be an object");
    const ConfigReader sub(params, fmt::format("{}: field '{}'", reader.where(), key));
    const std::string type =
        sub.has("rope_type") ? sub.get_string("rope_type") : sub.get_string("type", "default");
    if (type != "default" && type != "yarn") {
      throw_unsupported(
          "{}: field '{}' has rope_type '{}'; qwen hybrid models support 'default' and 'yarn'",
          reader.where(), key, type);
    }
    config.rope_theta = sub.get_double("rope_theta", config.rope_theta);
    config.partial_rotary_factor =
        sub.get_double("partial_rotary_factor", config.partial_rotary_factor);
    if (type == "yarn") {
      // The rotary share is handled here (rotary_dim); the yarn fields read like every family's.
      nlohmann::json yarn = params;
      yarn.erase("partial_rotary_factor");
      RopeParameters base;
      base.theta = config.rope_theta;
      config.rope = read_rope_object(reader, yarn, base, key);
    }
  }
  config.rope.theta = config.rope_theta;
  if (config.rope_theta <= 0) reader.fail("rope_theta", "must be positive");
  if (config.partial_rotary_factor <= 0 || config.partial_rotary_factor > 1) {
    reader.fail("partial_rotary_factor", "must be in (0, 1]");
  }
  const int64_t rd = config.rotary_dim();
  if (rd < 2 || rd % 2 != 0) {
    reader.fail("partial_rotary_factor",
                fmt::format("gives rotary dim {} for head_dim {}; need an even number >= 2", rd,
                            config.head_dim));
  }
}

GatedDeltaShape read_linear_shape(const ConfigReader& reader, double eps) {
  GatedDeltaShape s;  // defaults are HF's (Qwen3-Next-80B values)
  s.num_k_heads = reader.get_positive_int("linear_num_key_heads", s.num_k_heads);
  s.num_v_heads = reader.get_positive_int("linear_num_value_heads", s.num_v_heads);
  s.k_head_dim = reader.get_positive_int("linear_key_head_dim", s.k_head_dim);
  s.v_head_dim = reader.get_positive_int("linear_value_head_dim", s.v_head_dim);
  s.conv_kernel = reader.get_positive_int("linear_conv_kernel_dim", s.conv_kernel);
  s.eps = eps;
  if (s.num_v_heads % s.num_k_heads != 0) {
    reader.fail("linear_num_value_heads",
                fmt::format("({}) must be a multiple of linear_num_key_heads ({})", s.num_v_heads,
                            s.num_k_heads));
  }
  return s;
}

void read_feed_forward(const ConfigReader& reader, QwenFeedForward feed_forward,
                       QwenHybridConfig& config) {
  // Qwen3_5MoeTextConfig has no dense MLP (no intermediate_size) and no layer pattern for it.
  const bool every_layer = feed_forward == QwenFeedForward::kEveryLayerMoe;
  config.intermediate_size = every_layer ? reader.get_int("intermediate_size", 0)
                                         : reader.get_positive_int("intermediate_size");
  if (feed_forward == QwenFeedForward::kDense) return;
  config.num_experts = reader.get_int("num_experts", 512);
  if (config.num_experts < 0) reader.fail("num_experts", "must not be negative");
  if (config.num_experts == 0) return;
  config.num_experts_per_tok = reader.get_positive_int("num_experts_per_tok", 10);
  if (config.num_experts_per_tok > config.num_experts) {
    reader.fail("num_experts_per_tok", fmt::format("({}) exceeds num_experts ({})",
                                                   config.num_experts_per_tok, config.num_experts));
  }
  config.moe_intermediate_size = reader.get_positive_int("moe_intermediate_size", 512);
  config.shared_expert_intermediate_size =
      reader.get_positive_int("shared_expert_intermediate_size", 512);
  if (every_layer) {
    if (config.num_experts == 0)
      reader.fail("num_experts", "must be positive for qwen3_5_moe_text");
    return;  // Qwen3_5MoeTopKRouter always renormalises; defaults: every layer sparse
  }
  config.norm_topk_prob = reader.get_bool("norm_topk_prob", true);
  config.decoder_sparse_step = reader.get_positive_int("decoder_sparse_step", 1);
  if (reader.has("mlp_only_layers")) {
    for (int64_t i : reader.get_int_list("mlp_only_layers")) config.mlp_only_layers.insert(i);
  }
}

DType read_dtype(const ConfigReader& reader) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (reader.has(key) && reader.get(key).is_string() && reader.get_string(key) != "auto") {
      return parse_dtype(reader.get_string(key),
                         fmt::format("{}: field '{}'", reader.where(), key));
    }
  }
  return DType::kBFloat16;
}

}  // namespace

bool QwenHybridConfig::is_moe_layer(int64_t layer) const {
  return num_experts > 0 && !mlp_only_layers.contains(layer) &&
         (layer + 1) % decoder_sparse_step == 0;
}

QwenHybridConfig read_qwen_hybrid_config(const ConfigReader& reader, QwenFeedForward feed_forward) {
  QwenHybridConfig c;
  c.hidden_size = reader.get_positive_int("hidden_size");
  c.vocab_size = reader.get_positive_int("vocab_size");
  c.num_layers = reader.get_positive_int("num_hidden_layers");
  c.layer_kinds = read_layer_kinds(reader, c.num_layers);
  c.rms_norm_eps = reader.get_double("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = reader.get_bool("tie_word_embeddings", false);
  c.dtype = read_dtype(reader);
  c.num_heads = reader.get_positive_int("num_attention_heads");
  c.num_kv_heads = reader.get_positive_int("num_key_value_heads", c.num_heads);
  c.head_dim = reader.get_positive_int("head_dim", c.hidden_size / c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0) {
    reader.fail("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})",
                                                   c.num_kv_heads, c.num_heads));
  }
  read_rope(reader, c);
  c.linear = read_linear_shape(reader, c.rms_norm_eps);
  read_feed_forward(reader, feed_forward, c);
  const std::string act = reader.get_string("hidden_act", "silu");
  if (act != "silu")
    reader.fail("hidden_act", fmt::format("is '{}'; qwen hybrid models use silu", act));
  if (reader.get_bool("attention_bias", false)) {
    throw_unsupported("{}: field 'attention_bias' is true; qwen hybrid attention without bias only",
                      reader.where());
  }
  return c;
}

ModelSpec qwen_hybrid_spec(const QwenHybridConfig& config) {
  ModelSpec spec;
  spec.hidden_size = config.hidden_size;
  spec.vocab_size = config.vocab_size;
  spec.dtype = config.dtype;
  const GatedDeltaShape& lin = config.linear;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    LayerSpec layer;
    layer.id = i;
    layer.kind = config.layer_kinds[static_cast<size_t>(i)];
    if (layer.kind == LayerKind::kFullAttention) {
      layer.attention =
          AttentionShape{config.num_heads, config.num_kv_heads, config.head_dim, 0, 0};
    } else {
      layer.states.push_back({"conv_state",
                              {lin.conv_dim(), lin.conv_kernel},
                              config.dtype,
                              StateClass::kLinearState});
      layer.states.push_back({"recurrent_state",
                              {lin.num_v_heads, lin.k_head_dim, lin.v_head_dim},
                              DType::kFloat32,
                              StateClass::kLinearState});
    }
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

}  // namespace headwise::arch

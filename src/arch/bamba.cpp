// Bamba (`bamba`): Mamba-2 layers with Llama attention at `attn_layer_indices`. Config-level
// support (layer kinds and exact decode states for mem-estimate); no forward yet.
#include <algorithm>

#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

// BambaMixer: intermediate = mamba_expand * hidden_size; head_dim "auto" = intermediate / heads.
// Defaults are BambaConfig's (transformers 5.17).
Mamba2Shape bamba_mamba_shape(const ConfigReader& config) {
  Mamba2Shape s;
  s.intermediate = config.get_positive_int("mamba_expand", 2) * config.get_positive_int("hidden_size");
  s.heads = config.get_positive_int("mamba_n_heads", 128);
  s.head_dim = read_int_or_auto(config, "mamba_d_head").value_or(s.intermediate / s.heads);
  s.groups = config.get_positive_int("mamba_n_groups", 1);
  s.state_size = config.get_positive_int("mamba_d_state", 256);
  s.conv_kernel = config.get_positive_int("mamba_d_conv", 4);
  validate_mamba2(s, config);
  return s;
}

ModelSpec build_bamba_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  std::vector<int64_t> attention_layers;
  if (config.has("attn_layer_indices")) attention_layers = config.get_int_list("attn_layer_indices");
  for (int64_t i : attention_layers) {
    if (i < 0 || i >= num_layers) {
      config.fail("attn_layer_indices", fmt::format("names layer {} but the model has {} layers", i, num_layers));
    }
  }
  const AttentionShape attention = read_attention_shape(config);
  const Mamba2Shape mamba = bamba_mamba_shape(config);
  const DType dtype = config_dtype(config);
  ModelSpec spec;
  for (int64_t i = 0; i < num_layers; ++i) {
    LayerSpec layer;
    layer.id = i;
    if (std::find(attention_layers.begin(), attention_layers.end(), i) != attention_layers.end()) {
      layer.kind = LayerKind::kFullAttention;
      layer.attention = attention;
    } else {
      layer.kind = LayerKind::kMamba;
      // The torch scan returns float32 final states and the cache keeps them (checked in 5.17).
      layer.states = mamba2_states(mamba, dtype, DType::kFloat32);
    }
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

const RegisterArchitecture kRegister({"bamba", {"bamba"}, build_bamba_spec, {}});

}  // namespace
}  // namespace headwise::arch

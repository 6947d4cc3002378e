// GraniteMoeHybrid (`granitemoehybrid`, Granite 4.0-H): Mamba-2 (BambaMixer) and attention layers
// by `layer_types`. Config-level support only (layer kinds, exact decode states).
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

Mamba2Shape granite_mamba_shape(const ConfigReader& config) {
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

// Hub configs say "mamba"/"attention"; transformers 5 remaps them to linear/full names.
bool is_attention_type(const ConfigReader& config, const std::string& type) {
  if (type == "attention" || type == "full_attention") return true;
  if (type == "mamba" || type == "linear_attention") return false;
  config.fail("layer_types", fmt::format("has unknown entry '{}' (expected mamba or attention)", type));
}

ModelSpec build_granite_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  std::vector<std::string> types(static_cast<size_t>(num_layers), "mamba");  // HF default: all mamba
  if (config.has("layer_types")) types = read_layer_types(config, "layer_types", num_layers);
  const AttentionShape attention = read_attention_shape(config);
  const Mamba2Shape mamba = granite_mamba_shape(config);
  const DType dtype = config_dtype(config);
  ModelSpec spec;
  for (int64_t i = 0; i < num_layers; ++i) {
    LayerSpec layer;
    layer.id = i;
    if (is_attention_type(config, types[static_cast<size_t>(i)])) {
      layer.kind = LayerKind::kFullAttention;
      layer.attention = attention;
    } else {
      layer.kind = LayerKind::kMamba;
      layer.states = mamba2_states(mamba, dtype, DType::kFloat32);
    }
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

const RegisterArchitecture kRegister({"granitemoehybrid", {"granitemoehybrid"}, build_granite_spec, {}});

}  // namespace
}  // namespace headwise::arch

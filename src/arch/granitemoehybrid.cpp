// GraniteMoeHybrid (`granitemoehybrid`, Granite 4.0-H): Mamba-2 (BambaMixer) and attention layers
// by `layer_types`. Config-level support only (layer kinds, exact decode states).
#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

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
  const Mamba2Shape mamba = read_bamba_mamba2_shape(config, read_mamba_expand_intermediate(config));
  const DType dtype = config_dtype(config);
  const auto kind_of = [&](int64_t i) {
    return is_attention_type(config, types[static_cast<size_t>(i)]) ? LayerKind::kFullAttention : LayerKind::kMamba;
  };
  return stack_layers(num_layers, kind_of,
                      {.attention = attention, .recurrent_states = mamba2_states(mamba, dtype, DType::kFloat32)});
}

const RegisterArchitecture kRegister({"granitemoehybrid", {"granitemoehybrid"}, build_granite_spec, {}});

}  // namespace
}  // namespace headwise::arch

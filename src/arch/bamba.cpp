// Bamba (`bamba`): Mamba-2 layers with Llama attention at `attn_layer_indices`. Config-level
// support (layer kinds and exact decode states for mem-estimate); no forward yet.
#include <algorithm>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

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
  // BambaMixer: intermediate = mamba_expand * hidden_size. Defaults are BambaConfig's (transformers 5.17).
  const Mamba2Shape mamba = read_bamba_mamba2_shape(config, read_mamba_expand_intermediate(config));
  const DType dtype = config_dtype(config);
  const auto kind_of = [&](int64_t i) {
    const bool is_attention = std::find(attention_layers.begin(), attention_layers.end(), i) != attention_layers.end();
    return is_attention ? LayerKind::kFullAttention : LayerKind::kMamba;
  };
  // The torch scan returns float32 final states and the cache keeps them (checked in 5.17).
  return stack_layers(num_layers, kind_of,
                      {.attention = attention, .recurrent_states = mamba2_states(mamba, dtype, DType::kFloat32)});
}

const RegisterArchitecture kRegister({"bamba", {"bamba"}, build_bamba_spec, {}});

}  // namespace
}  // namespace headwise::arch

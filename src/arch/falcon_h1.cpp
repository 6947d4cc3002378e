// Falcon-H1 (`falcon_h1`): every layer runs a Mamba-2 mixer and global attention in parallel,
// so every layer is a global layer (its KV heads take windows) that also keeps conv + SSM
// states. Config-level support only.
#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

Mamba2Shape falcon_mamba_shape(const ConfigReader& config) {
  // FalconH1Config: mamba_d_ssm defaults to 1024 when absent; an explicit null means expand * hidden.
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
  ModelSpec spec = stack_layers(std::vector<LayerKind>(static_cast<size_t>(num_layers), LayerKind::kFullAttention),
                                {.attention = attention});
  for (LayerSpec& layer : spec.layers) layer.states = mamba2_states(mamba, dtype, DType::kFloat32);
  return spec;
}

const RegisterArchitecture kRegister({"falcon_h1", {"falcon_h1"}, build_falcon_h1_spec, {}});

}  // namespace
}  // namespace headwise::arch

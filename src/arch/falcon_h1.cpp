// Falcon-H1 (`falcon_h1`): every layer runs a Mamba-2 mixer and global attention in parallel,
// so every layer is a global layer (its KV heads take windows) that also keeps conv + SSM
// states. Config-level support only.
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

Mamba2Shape falcon_mamba_shape(const ConfigReader& config) {
  Mamba2Shape s;
  // FalconH1Config: mamba_d_ssm defaults to 1024 when absent; an explicit null means expand * hidden.
  if (!config.json().contains("mamba_d_ssm")) {
    s.intermediate = 1024;
  } else if (config.has("mamba_d_ssm")) {
    s.intermediate = config.get_positive_int("mamba_d_ssm");
  } else {
    s.intermediate = config.get_positive_int("mamba_expand", 2) * config.get_positive_int("hidden_size");
  }
  s.heads = config.get_positive_int("mamba_n_heads", 128);
  s.head_dim = read_int_or_auto(config, "mamba_d_head").value_or(s.intermediate / s.heads);
  s.groups = config.get_positive_int("mamba_n_groups", 1);
  s.state_size = config.get_positive_int("mamba_d_state", 256);
  s.conv_kernel = config.get_positive_int("mamba_d_conv", 4);
  validate_mamba2(s, config);
  return s;
}

ModelSpec build_falcon_h1_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  const AttentionShape attention = read_attention_shape(config);
  const Mamba2Shape mamba = falcon_mamba_shape(config);
  const DType dtype = config_dtype(config);
  ModelSpec spec;
  for (int64_t i = 0; i < num_layers; ++i) {
    LayerSpec layer;
    layer.id = i;
    layer.kind = LayerKind::kFullAttention;  // attention + mamba in parallel; KV grows with context
    layer.attention = attention;
    layer.states = mamba2_states(mamba, dtype, DType::kFloat32);
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

const RegisterArchitecture kRegister({"falcon_h1", {"falcon_h1"}, build_falcon_h1_spec, {}});

}  // namespace
}  // namespace headwise::arch

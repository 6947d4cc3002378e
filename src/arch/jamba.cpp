// Jamba (`jamba`): Mamba-1 layers with attention (no RoPE) iff i % attn_layer_period ==
// attn_layer_offset. Mamba-1 keeps conv (intermediate, K) and SSM (intermediate, state) states.
// Config-level support only.
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

ModelSpec build_jamba_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  const int64_t period = config.get_positive_int("attn_layer_period", 8);
  const int64_t offset = config.get_int("attn_layer_offset", 4);
  if (offset < 0 || offset >= period) {
    config.fail("attn_layer_offset", fmt::format("({}) must be in [0, attn_layer_period = {})", offset, period));
  }
  const AttentionShape attention = read_attention_shape(config);
  const int64_t intermediate = config.get_positive_int("mamba_expand", 2) * config.get_positive_int("hidden_size");
  const int64_t conv_kernel = config.get_positive_int("mamba_d_conv", 4);
  const int64_t state_size = config.get_positive_int("mamba_d_state", 16);
  const DType dtype = config_dtype(config);
  ModelSpec spec;
  for (int64_t i = 0; i < num_layers; ++i) {
    LayerSpec layer;
    layer.id = i;
    if (i % period == offset) {
      layer.kind = LayerKind::kFullAttention;
      layer.attention = attention;
    } else {
      layer.kind = LayerKind::kMamba;
      layer.states = mamba1_states(intermediate, conv_kernel, state_size, dtype);
    }
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

const RegisterArchitecture kRegister({"jamba", {"jamba"}, build_jamba_spec, {}});

}  // namespace
}  // namespace headwise::arch

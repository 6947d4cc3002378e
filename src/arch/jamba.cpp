// Jamba (`jamba`): Mamba-1 layers with attention (no RoPE) iff i % attn_layer_period ==
// attn_layer_offset. Mamba-1 keeps conv (intermediate, K) and SSM (intermediate, state) states.
// Config-level support only.
#include "headwise/arch/layer_stack.hpp"
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
  const int64_t intermediate = read_mamba_expand_intermediate(config);
  const int64_t conv_kernel = config.get_positive_int("mamba_d_conv", 4);
  const int64_t state_size = config.get_positive_int("mamba_d_state", 16);
  const DType dtype = config_dtype(config);
  const auto kind_of = [&](int64_t i) { return i % period == offset ? LayerKind::kFullAttention : LayerKind::kMamba; };
  return stack_layers(num_layers, kind_of,
                      {.attention = attention,
                       .recurrent_states = mamba1_states(intermediate, conv_kernel, state_size, dtype)});
}

const RegisterArchitecture kRegister({"jamba", {"jamba"}, build_jamba_spec, {}});

}  // namespace
}  // namespace headwise::arch

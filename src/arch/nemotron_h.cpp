// NemotronH (`nemotron_h`): one mixer per block — Mamba-2, attention (no RoPE), MLP or MoE — by
// `layer_types` / `layers_block_type` (transformers 5) or the Hub's `hybrid_override_pattern`
// (M mamba, * attention, - MLP, E MoE). Config-level support only.
#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

LayerKind kind_of_block(const ConfigReader& config, std::string_view key, const std::string& type) {
  if (type == "M" || type == "mamba" || type == "linear_attention") return LayerKind::kMamba;
  if (type == "*" || type == "attention" || type == "full_attention") return LayerKind::kFullAttention;
  if (type == "-" || type == "E" || type == "mlp" || type == "moe") return LayerKind::kMlpOnly;
  config.fail(key, fmt::format("has unknown block type '{}' (expected M, *, -, E or their long names)", type));
}

std::vector<LayerKind> read_block_kinds(const ConfigReader& config) {
  std::vector<LayerKind> kinds;
  for (const char* key : {"layer_types", "layers_block_type"}) {
    if (!config.has(key)) continue;
    for (const auto& type : config.get_string_list(key)) kinds.push_back(kind_of_block(config, key, type));
    return kinds;
  }
  const std::string pattern = config.get_string("hybrid_override_pattern");
  for (char c : pattern) kinds.push_back(kind_of_block(config, "hybrid_override_pattern", std::string(1, c)));
  return kinds;
}

// Accepts the legacy (mamba_*) names NemotronHConfig still maps.
int64_t int_field(const ConfigReader& config, std::string_view key, std::string_view legacy, int64_t fallback) {
  if (config.has(key)) return config.get_positive_int(key);
  return config.get_positive_int(legacy, fallback);
}

ModelSpec build_nemotron_h_spec(const ConfigReader& config) {
  const std::vector<LayerKind> kinds = read_block_kinds(config);
  if (kinds.empty()) config.fail("hybrid_override_pattern", "is empty");
  AttentionShape attention = read_attention_shape(config);
  if (!config.has("head_dim")) attention.head_dim = 128;  // NemotronHConfig default, not hidden/heads
  Mamba2Shape mamba;
  mamba.heads = config.get_positive_int("mamba_num_heads", 128);
  mamba.head_dim = config.get_positive_int("mamba_head_dim", 64);
  mamba.intermediate = mamba.heads * mamba.head_dim;
  mamba.groups = int_field(config, "n_groups", "mamba_n_groups", 8);
  mamba.state_size = config.get_positive_int("ssm_state_size", 128);
  mamba.conv_kernel = int_field(config, "conv_kernel", "mamba_d_conv", 4);
  validate_mamba2(mamba, config);
  // The config declares the SSM cache dtype (default float32, what the scan returns anyway).
  const DType ssm_dtype = parse_dtype(config.get_string("mamba_ssm_cache_dtype", "float32"),
                                      fmt::format("{}: field 'mamba_ssm_cache_dtype'", config.where()));
  const DType dtype = config_dtype(config);
  return stack_layers(kinds, {.attention = attention, .recurrent_states = mamba2_states(mamba, dtype, ssm_dtype)});
}

const RegisterArchitecture kRegister({"nemotron_h", {"nemotron_h"}, build_nemotron_h_spec, {}});

}  // namespace
}  // namespace headwise::arch

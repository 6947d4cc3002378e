#include "headwise/arch/state_shapes.hpp"

#include <fmt/format.h>

namespace headwise::arch {

DType config_dtype(const ConfigReader& config) {
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (config.has(key) && config.get(key).is_string() && config.get_string(key) != "auto") {
      return parse_dtype(config.get_string(key),
                         fmt::format("{}: field '{}'", config.where(), key));
    }
  }
  return DType::kBFloat16;
}

void validate_mamba2(const Mamba2Shape& s, const ConfigReader& config) {
  if (s.heads * s.head_dim != s.intermediate) {
    config.fail("mamba head_dim",
                fmt::format("times {} heads must equal the mamba intermediate size {}, got {}",
                            s.heads, s.intermediate, s.head_dim));
  }
  if (s.groups <= 0 || s.heads % s.groups != 0) {
    config.fail("mamba groups",
                fmt::format("({}) must divide the {} mamba heads", s.groups, s.heads));
  }
}

int64_t read_mamba_expand_intermediate(const ConfigReader& config) {
  return config.get_positive_int("mamba_expand", 2) * config.get_positive_int("hidden_size");
}

Mamba2Shape read_bamba_mamba2_shape(const ConfigReader& config, int64_t intermediate) {
  Mamba2Shape s;
  s.intermediate = intermediate;
  s.heads = config.get_positive_int("mamba_n_heads", 128);
  s.head_dim = read_int_or_auto(config, "mamba_d_head").value_or(s.intermediate / s.heads);
  s.groups = config.get_positive_int("mamba_n_groups", 1);
  s.state_size = config.get_positive_int("mamba_d_state", 256);
  s.conv_kernel = config.get_positive_int("mamba_d_conv", 4);
  validate_mamba2(s, config);
  return s;
}

std::vector<StateTensorSpec> mamba2_states(const Mamba2Shape& s, DType conv_dtype,
                                           DType ssm_dtype) {
  const int64_t conv_dim = s.intermediate + 2 * s.groups * s.state_size;
  return {
      {"conv_state", {conv_dim, s.conv_kernel}, conv_dtype, StateClass::kSsmState},
      {"ssm_state", {s.heads, s.head_dim, s.state_size}, ssm_dtype, StateClass::kSsmState},
  };
}

std::vector<StateTensorSpec> mamba1_states(int64_t intermediate, int64_t conv_kernel,
                                           int64_t state_size, DType conv_dtype) {
  return {
      {"conv_state", {intermediate, conv_kernel}, conv_dtype, StateClass::kSsmState},
      {"ssm_state", {intermediate, state_size}, DType::kFloat32, StateClass::kSsmState},
  };
}

std::vector<StateTensorSpec> short_conv_states(int64_t hidden, int64_t l_cache, DType conv_dtype) {
  return {{"conv_state", {hidden, l_cache}, conv_dtype, StateClass::kOtherState}};
}

AttentionShape read_attention_shape(const ConfigReader& config) {
  AttentionShape shape;
  shape.num_heads = config.get_positive_int("num_attention_heads");
  shape.num_kv_heads = config.get_positive_int("num_key_value_heads", shape.num_heads);
  if (config.has("head_dim")) {
    shape.head_dim = config.get_positive_int("head_dim");
  } else {
    const int64_t hidden = config.get_positive_int("hidden_size");
    if (hidden % shape.num_heads != 0) {
      config.fail(
          "hidden_size",
          fmt::format("({}) is not divisible by num_attention_heads ({}) and no head_dim is given",
                      hidden, shape.num_heads));
    }
    shape.head_dim = hidden / shape.num_heads;
  }
  if (shape.num_heads % shape.num_kv_heads != 0) {
    config.fail("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})",
                                                   shape.num_kv_heads, shape.num_heads));
  }
  return shape;
}

AttentionShape sliding_attention_shape(AttentionShape shape, int64_t window) {
  shape.sliding_window = window;
  // HF's DynamicSlidingWindowLayer keeps the last W - 1 keys between steps: the step's own
  // token makes the W-th. The runtime attends over ring + chunk before writing, so W - 1
  // slots are exactly enough; every architecture uses this one rule.
  shape.sliding_cache_tokens = window - 1;
  return shape;
}

std::optional<int64_t> read_int_or_auto(const ConfigReader& config, std::string_view key) {
  if (!config.has(key)) return std::nullopt;
  const auto& value = config.get(key);
  if (value.is_string() && value.get<std::string>() == "auto") return std::nullopt;
  return config.get_positive_int(key);
}

std::vector<std::string> read_layer_types(const ConfigReader& config, std::string_view key,
                                          int64_t num_layers) {
  std::vector<std::string> types = config.get_string_list(key);
  if (static_cast<int64_t>(types.size()) != num_layers) {
    config.fail(
        key, fmt::format("has {} entries but num_hidden_layers is {}", types.size(), num_layers));
  }
  return types;
}

}  // namespace headwise::arch

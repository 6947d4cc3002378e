// LFM2 (`lfm2`): gated short-convolution layers and full attention layers. The conv state is
// (hidden, conv_L_cache) in the model dtype. Config-level support only.
#include <algorithm>

#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

std::vector<std::string> lfm2_layer_types(const ConfigReader& config, int64_t num_layers) {
  if (config.has("layer_types")) return read_layer_types(config, "layer_types", num_layers);
  // Legacy configs list the attention layers; Lfm2Config's default is all attention.
  std::vector<int64_t> full(static_cast<size_t>(num_layers));
  for (int64_t i = 0; i < num_layers; ++i) full[static_cast<size_t>(i)] = i;
  if (config.has("full_attn_idxs")) full = config.get_int_list("full_attn_idxs");
  std::vector<std::string> types;
  for (int64_t i = 0; i < num_layers; ++i) {
    types.push_back(std::find(full.begin(), full.end(), i) != full.end() ? "full_attention" : "conv");
  }
  return types;
}

ModelSpec build_lfm2_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  const std::vector<std::string> types = lfm2_layer_types(config, num_layers);
  const AttentionShape attention = read_attention_shape(config);
  const int64_t hidden = config.get_positive_int("hidden_size");
  const int64_t l_cache = config.get_positive_int("conv_L_cache", 3);
  const DType dtype = config_dtype(config);
  const auto kind_of = [&](int64_t i) {
    return layer_kind_of_type(config, types[static_cast<size_t>(i)], i,
                              {{"full_attention", LayerKind::kFullAttention},
                               {"conv", LayerKind::kShortConv},
                               {"linear_attention", LayerKind::kShortConv}});  // 5.x remaps "conv" to this
  };
  return stack_layers(num_layers, kind_of,
                      {.attention = attention, .recurrent_states = short_conv_states(hidden, l_cache, dtype)});
}

const RegisterArchitecture kRegister({"lfm2", {"lfm2"}, build_lfm2_spec, {}});

}  // namespace
}  // namespace headwise::arch

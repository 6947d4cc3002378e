// GPT-OSS (`gpt_oss`): alternating sliding (window 128) and global attention layers, MoE FFN.
// Learned attention sinks are logits, not cached tokens: they cost no cache memory.
// Config-level support only.
#include "headwise/arch/layer_stack.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {
namespace {

ModelSpec build_gpt_oss_spec(const ConfigReader& config) {
  const int64_t num_layers = config.get_positive_int("num_hidden_layers");
  std::vector<std::string> types;
  if (config.has("layer_types")) {
    types = read_layer_types(config, "layer_types", num_layers);
  } else {
    // GptOssConfig default: even layers sliding, odd layers full.
    for (int64_t i = 0; i < num_layers; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  }
  AttentionShape global = read_attention_shape(config);
  if (!config.has("head_dim")) global.head_dim = 64;  // GptOssConfig default
  const int64_t window = config.get_positive_int("sliding_window", 128);
  const auto kind_of = [&](int64_t i) {
    return layer_kind_of_type(config, types[static_cast<size_t>(i)], i,
                              {{"full_attention", LayerKind::kFullAttention},
                               {"sliding_attention", LayerKind::kSlidingAttention}});
  };
  return stack_layers(num_layers, kind_of, {.attention = global, .sliding_window = window});
}

const RegisterArchitecture kRegister({"gpt_oss", {"gpt_oss"}, build_gpt_oss_spec, {}});

}  // namespace
}  // namespace headwise::arch

#pragma once
// The layer list of a ModelSpec. In every architecture here all layers of one kind look alike
// (the same attention shape, the same decode states), so builders only say which kind each
// layer is and what each kind holds; the list is then put together in one place.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "headwise/arch/model_spec.hpp"

namespace headwise::arch {

struct LayerContents {
  AttentionShape attention;    // full-attention layers take it as is (global)
  int64_t sliding_window = 0;  // sliding-attention layers take `attention` with this window
  std::vector<StateTensorSpec> recurrent_states =
      {};  // Mamba, short-conv and linear-attention layers
};

// Layers 0..num_layers-1 of kind `kind_of(i)` (which may reject a config entry: it is asked in
// layer order), each with its kind's contents; MLP-only layers hold nothing. Only `layers` is
// filled in.
ModelSpec stack_layers(int64_t num_layers, const std::function<LayerKind(int64_t)>& kind_of,
                       const LayerContents& contents);
ModelSpec stack_layers(const std::vector<LayerKind>& kinds, const LayerContents& contents);

// A decoder of full and sliding attention layers that also records hidden_size and vocab_size:
// Llama, Qwen3 and Gemma 3 configs may leave them to their config class defaults, which the
// registry's fallback (config.json's own fields) would miss.
struct AttentionStack {
  std::vector<LayerKind> kinds;
  AttentionShape attention;  // global
  int64_t sliding_window = 0;
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
};
ModelSpec attention_stack_spec(const AttentionStack& stack);

// The same from an attention-only family's parsed config (Llama/Qwen3, Gemma 3, gpt-oss), whose
// fields carry these names.
template <typename Config>
ModelSpec attention_stack_spec_of(const Config& c) {
  return attention_stack_spec({.kinds = c.kinds,
                               .attention = {c.num_heads, c.num_kv_heads, c.head_dim, 0, 0},
                               .sliding_window = c.sliding_window,
                               .hidden_size = c.hidden_size,
                               .vocab_size = c.vocab_size});
}

// `layer_types` of a model with only full and sliding attention layers (Gemma 3, Qwen3): one
// entry per layer, each full_attention or sliding_attention; `family` names the model in the
// error.
std::vector<LayerKind> read_attention_layer_kinds(const ConfigReader& config, int64_t num_layers,
                                                  std::string_view family);

// The kind of layer `layer`, whose `layer_types` entry is `type`, among an architecture's
// `known` names; another name is a config error naming the layer.
LayerKind layer_kind_of_type(const ConfigReader& config, const std::string& type, int64_t layer,
                             std::initializer_list<std::pair<std::string_view, LayerKind>> known);

}  // namespace headwise::arch

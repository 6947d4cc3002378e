#include "headwise/arch/layer_stack.hpp"

#include <fmt/format.h>

#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {

ModelSpec stack_layers(int64_t num_layers, const std::function<LayerKind(int64_t)>& kind_of,
                       const LayerContents& contents) {
  ModelSpec spec;
  for (int64_t i = 0; i < num_layers; ++i) {
    LayerSpec layer;
    layer.id = i;
    layer.kind = kind_of(i);
    switch (layer.kind) {
      case LayerKind::kFullAttention:
        layer.attention = contents.attention;
        break;
      case LayerKind::kSlidingAttention:
        layer.attention = sliding_attention_shape(contents.attention, contents.sliding_window);
        break;
      case LayerKind::kLinearAttention:
      case LayerKind::kMamba:
      case LayerKind::kShortConv:
        layer.states = contents.recurrent_states;
        break;
      case LayerKind::kMlpOnly:
        break;
    }
    spec.layers.push_back(std::move(layer));
  }
  return spec;
}

ModelSpec stack_layers(const std::vector<LayerKind>& kinds, const LayerContents& contents) {
  return stack_layers(
      static_cast<int64_t>(kinds.size()), [&](int64_t i) { return kinds[static_cast<size_t>(i)]; },
      contents);
}

ModelSpec attention_stack_spec(const AttentionStack& stack) {
  ModelSpec spec = stack_layers(
      stack.kinds, {.attention = stack.attention, .sliding_window = stack.sliding_window});
  spec.hidden_size = stack.hidden_size;
  spec.vocab_size = stack.vocab_size;
  return spec;
}

std::vector<LayerKind> read_attention_layer_kinds(const ConfigReader& config, int64_t num_layers,
                                                  std::string_view family) {
  std::vector<LayerKind> kinds;
  for (const auto& name : config.get_string_list("layer_types")) {
    const LayerKind kind =
        parse_layer_kind(name, fmt::format("{}: field 'layer_types'", config.where()));
    if (kind != LayerKind::kFullAttention && kind != LayerKind::kSlidingAttention) {
      config.fail(
          "layer_types",
          fmt::format("has '{}'; {} layers are full_attention or sliding_attention", name, family));
    }
    kinds.push_back(kind);
  }
  // Checked after the entries, so an unknown entry is named even in a list of the wrong length.
  if (static_cast<int64_t>(kinds.size()) != num_layers) {
    config.fail("layer_types",
                fmt::format("has {} entries for num_hidden_layers = {}", kinds.size(), num_layers));
  }
  return kinds;
}

LayerKind layer_kind_of_type(const ConfigReader& config, const std::string& type, int64_t layer,
                             std::initializer_list<std::pair<std::string_view, LayerKind>> known) {
  for (const auto& [name, kind] : known) {
    if (type == name) return kind;
  }
  config.fail("layer_types", fmt::format("has unknown entry '{}' at layer {}", type, layer));
}

}  // namespace headwise::arch

#include "headwise/arch/weight_list.hpp"

#include <fmt/format.h>

namespace headwise::arch {

void LayerWeights::add(std::string_view name, std::vector<int64_t> shape) {
  list_.push_back({fmt::format("{}{}", prefix_, name), std::move(shape), layer_});
}

void LayerWeights::add_all(std::string_view module, const NamedShapes& shapes) {
  for (const auto& [name, shape] : shapes) add(fmt::format("{}{}", module, name), shape);
}

void LayerWeights::linear(std::string_view name, int64_t out, int64_t in, bool bias) {
  add(fmt::format("{}.weight", name), {out, in});
  if (bias) add(fmt::format("{}.bias", name), {out});
}

void LayerWeights::attention(std::string_view module, const AttentionProjections& p) {
  const int64_t q_out = p.heads * p.head_dim, kv_out = p.kv_heads * p.head_dim;
  linear(fmt::format("{}q_proj", module), q_out, p.hidden, p.bias);
  linear(fmt::format("{}k_proj", module), kv_out, p.hidden, p.bias);
  linear(fmt::format("{}v_proj", module), kv_out, p.hidden, p.bias);
  linear(fmt::format("{}{}", module, p.out), p.hidden, q_out, p.bias);
}

void LayerWeights::gated_mlp(std::string_view module, int64_t hidden, int64_t intermediate,
                             bool bias) {
  linear(fmt::format("{}gate_proj", module), intermediate, hidden, bias);
  linear(fmt::format("{}up_proj", module), intermediate, hidden, bias);
  linear(fmt::format("{}down_proj", module), hidden, intermediate, bias);
}

void WeightList::add(std::string name, std::vector<int64_t> shape, int64_t layer) {
  list_.push_back({std::move(name), std::move(shape), layer});
}

void WeightList::add_embedding_norm_and_head(const OuterWeights& outer, int64_t num_layers) {
  add(outer.embedding, {outer.vocab_size, outer.hidden_size}, -1);
  add(outer.final_norm, {outer.hidden_size}, num_layers);
  if (!outer.tied) add(outer.head, {outer.vocab_size, outer.hidden_size}, num_layers);
}

LayerWeights WeightList::layer(int64_t layer) {
  return LayerWeights(list_, fmt::format("{}layers.{}.", prefix_, layer), layer);
}

WeightList DecoderModel::decoder_weights(const OuterWeights& outer,
                                         std::string layer_prefix) const {
  WeightList list(std::move(layer_prefix));
  list.add_embedding_norm_and_head(outer, spec().num_layers());
  return list;
}

}  // namespace headwise::arch

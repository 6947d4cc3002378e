#pragma once
// The builder every architecture's required_weights() uses: the tensors outside the layers once,
// then each layer's under `<prefix>layers.<i>.`, so an architecture's builder reads as the list of
// its own tensors. Order is kept as added: the load check reports the first missing tensor in it,
// and a layer's prefetch reads its tensors in it.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "headwise/arch/model.hpp"

namespace headwise::arch {

// A decoder's tensors outside its layers, named as in the checkpoint.
struct OuterWeights {
  int64_t vocab_size = 0, hidden_size = 0;
  bool tied = false;  // the LM head is the embedding table: no head tensor
  std::string embedding = "model.embed_tokens.weight";
  std::string final_norm = "model.norm.weight";
  std::string head = "lm_head.weight";
};

// The same from a parsed config whose fields carry the usual names (vocab_size, hidden_size,
// tie_word_embeddings); the final norm's name differs most between families.
template <typename Config>
OuterWeights outer_weights_of(const Config& c, std::string final_norm = "model.norm.weight") {
  return {.vocab_size = c.vocab_size,
          .hidden_size = c.hidden_size,
          .tied = c.tie_word_embeddings,
          .final_norm = std::move(final_norm)};
}

// Grouped-query attention's q, k, v and output projections (nn.Linear, [out, in]).
struct AttentionProjections {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool bias = false;
  std::string_view out = "o_proj";  // LFM2 calls it out_proj
};

// The projections of a parsed config whose fields carry the usual names (hidden_size, num_heads,
// num_kv_heads, head_dim).
template <typename Config>
AttentionProjections attention_projections_of(const Config& c, bool bias = false,
                                              std::string_view out = "o_proj") {
  return {.hidden = c.hidden_size,
          .heads = c.num_heads,
          .kv_heads = c.num_kv_heads,
          .head_dim = c.head_dim,
          .bias = bias,
          .out = out};
}

// (name under a module, shape) pairs, as mamba2_weight_shapes lists a mixer's tensors.
using NamedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

class WeightList;

// The tensors of one decoder layer; a view into its WeightList, valid while that lives.
class LayerWeights {
 public:
  int64_t index() const { return layer_; }
  // `<prefix>layers.<layer>.<name>`.
  void add(std::string_view name, std::vector<int64_t> shape);
  // Each of `shapes` under `module` ("mamba." + "conv1d.weight").
  void add_all(std::string_view module, const NamedShapes& shapes);
  // nn.Linear `<name>.weight` [out, in], then `<name>.bias` [out] when `bias`.
  void linear(std::string_view name, int64_t out, int64_t in, bool bias = false);
  // `<module>q_proj`, `k_proj`, `v_proj` ([heads or kv_heads x head_dim, hidden]) and the output
  // projection [hidden, heads x head_dim], each with its bias when `p.bias`.
  void attention(std::string_view module, const AttentionProjections& p);
  // A gated MLP `<module>gate_proj`, `up_proj` ([intermediate, hidden]) and `down_proj`
  // ([hidden, intermediate]), each with its bias when `bias`.
  void gated_mlp(std::string_view module, int64_t hidden, int64_t intermediate, bool bias = false);

 private:
  friend class WeightList;
  LayerWeights(std::vector<WeightRequirement>& list, std::string prefix, int64_t layer)
      : list_(list), prefix_(std::move(prefix)), layer_(layer) {}

  std::vector<WeightRequirement>& list_;
  std::string prefix_;  // "<prefix>layers.<layer>."
  int64_t layer_;
};

class WeightList {
 public:
  // Layers' tensors are named `<layer_prefix>layers.<i>.<name>`.
  explicit WeightList(std::string layer_prefix = "model.") : prefix_(std::move(layer_prefix)) {}

  // A tensor outside the layers under its full name. `layer` files it with the layer that reads
  // it: -1 for embed(), num_layers for logits().
  void add(std::string name, std::vector<int64_t> shape, int64_t layer);
  // The opening most decoders share: the embedding table [vocab, hidden] at -1, then the final
  // norm [hidden] and, unless tied, the head [vocab, hidden], both at `num_layers`.
  void add_embedding_norm_and_head(const OuterWeights& outer, int64_t num_layers);
  LayerWeights layer(int64_t layer);

  std::vector<WeightRequirement> take() && { return std::move(list_); }

 private:
  std::string prefix_;
  std::vector<WeightRequirement> list_;
};

}  // namespace headwise::arch

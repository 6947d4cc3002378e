#pragma once
// A decoder model that runs one layer at a time. This per-layer API is the heart of
// headwise: SeqCalib walks layers in execution order, streaming each layer's weights from the
// memory-mapped checkpoint, and intercepts global attention through an `AttentionCore`.
#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/registry.hpp"

namespace headwise::io {
class Checkpoint;
}

namespace headwise::arch {

class LayerPrefetcher;
class WeightList;
struct OuterWeights;

// Everything an attention layer hands to its attention core. The core computes softmax
// attention; the layer applies `output_gate` and `o_proj` afterwards. Carrying the gate and
// o_proj here lets a measuring core compute the block-output distortion of truncating a head.
struct AttentionInputs {
  int64_t layer_id = 0;
  at::Tensor q;  // [B, num_heads, T, head_dim], after q-norm and RoPE
  at::Tensor k;  // [B, num_kv_heads, T, head_dim], after k-norm and RoPE (what a cache stores)
  at::Tensor v;  // [B, num_kv_heads, T, head_dim]
  double scaling = 1.0;
  double logit_softcap = 0.0;   // 0 = none; else scores = c * tanh(scores / c)
  at::Tensor sink_logits{};     // [num_heads] learned sink logits (gpt-oss), or undefined
  int64_t sliding_window = 0;   // 0 for global layers
  int64_t position_offset = 0;  // position of q[..., 0, :] (and of k[..., 0, :])
  at::Tensor output_gate{};  // [B, T, num_heads, head_dim] multiplied into the output, or undefined
  at::Tensor o_proj_weight{};  // [hidden, num_heads * head_dim]
};

class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // Returns the attention output [B, T, num_heads, head_dim] in q's dtype.
  virtual at::Tensor attend(const AttentionInputs& inputs) = 0;
};

// Exact causal attention (sliding where the layer is sliding), query-chunked.
class ExactAttentionCore final : public AttentionCore {
 public:
  explicit ExactAttentionCore(int64_t chunk = 512) : chunk_(chunk) {}
  at::Tensor attend(const AttentionInputs& inputs) override;

 private:
  int64_t chunk_;
};

// Named decode-state tensors of one layer (names as in LayerSpec::states), batch first.
using LayerState = std::map<std::string, at::Tensor>;

struct LayerRun {
  AttentionCore* attention = nullptr;  // null: ExactAttentionCore
  LayerState* state = nullptr;         // null: fresh sequence, final state not kept
  int64_t position_offset = 0;
};

struct WeightRequirement {
  std::string name;
  std::vector<int64_t> shape;
  int64_t layer = -1;      // -1: embeddings / final norm / head
  bool keep_fp32 = false;  // architectures that keep some tensors in fp32 (gpt-oss norms)
  bool optional = false;
};

class DecoderModel {
 public:
  DecoderModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
               const ModelOptions& options);
  virtual ~DecoderModel();
  DecoderModel(const DecoderModel&) = delete;
  DecoderModel& operator=(const DecoderModel&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const io::Checkpoint& checkpoint() const { return *checkpoint_; }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t attention_chunk() const { return options_.attention_chunk; }

  // input_ids [B, T] int64 → hidden [B, T, H]
  virtual at::Tensor embed(const at::Tensor& input_ids) = 0;
  // hidden [B, T, H] → hidden [B, T, H], running layer `layer` (0-based, execution order)
  virtual at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) = 0;
  // hidden [B, T, H] → logits [B, T, V] float32 (final norm, head, soft-capping)
  virtual at::Tensor logits(const at::Tensor& hidden) = 0;

  // Embeddings and every layer, attention through `core` (prefetching the next layer's weights):
  // [B, T] → hidden [B, T, H] before the final norm. Runs in the caller's autograd mode.
  at::Tensor hidden_states(const at::Tensor& input_ids, AttentionCore& core);
  // Plain prefill with exact attention: [B, T] → [B, T, V] float32.
  at::Tensor forward(const at::Tensor& input_ids);

  // Every tensor the model reads, with its shape; checked against the checkpoint at load.
  virtual std::vector<WeightRequirement> required_weights() const = 0;
  // Throws InputError naming the tensor and file on a missing tensor or a wrong shape.
  void validate_weights() const;

  // Starts loading layer `layer`'s weights in the background (layer_prefetch.hpp) so they are
  // ready when run_layer(layer) asks; no-op when out of range or already resident.
  void prefetch_layer(int64_t layer);
  // Drops the device copies of a layer's weights (layer streaming) and its mapped pages.
  void release_layer(int64_t layer);
  void release_all();
  int64_t resident_weight_bytes() const;

 protected:
  // The tensor on the model's device at the compute dtype (fp32 when keep_fp32), cached under
  // `layer` until released. Index-free names are the checkpoint's.
  const at::Tensor& weight(int64_t layer, const std::string& name, bool keep_fp32 = false);
  bool has_weight(const std::string& name) const;
  // `<prefix>layers.<layer>.<name>`: a decoder layer's tensor under the usual naming.
  const at::Tensor& layer_tensor(int64_t layer, std::string_view name,
                                 std::string_view prefix = "model.", bool keep_fp32 = false);
  // The list required_weights() builds (weight_list.hpp), begun with the embedding table, the
  // final norm and the head unless tied; layers' tensors go under `<layer_prefix>layers.<i>.`, the
  // names layer_tensor() reads.
  WeightList decoder_weights(const OuterWeights& outer, std::string layer_prefix = "model.") const;
  // nn.Linear `<name>.weight` (+ `<name>.bias` when `bias`) of decoder layer `layer`, applied to x.
  at::Tensor layer_linear(int64_t layer, std::string_view name, const at::Tensor& x, bool bias,
                          std::string_view prefix = "model.");
  // The token embedding table `name` looked up for input_ids.
  at::Tensor embed_tokens(const at::Tensor& input_ids,
                          const std::string& name = "model.embed_tokens.weight");
  // The final norm `norm` (a top-level tensor) then the LM head: `lm_head.weight`, or the embedding
  // table `embedding` when tied. [B, T, vocab] fp32.
  at::Tensor norm_and_head(const at::Tensor& hidden, const std::string& norm, double eps,
                           NormStyle style, bool tied,
                           const std::string& embedding = "model.embed_tokens.weight");
  // How an attention block ends in every family: `in` (q, k, v as [B, heads, T, hd] after norms
  // and RoPE, with scaling, window and sinks set) through the run's core at the run's position,
  // then the layer's output projection `<o_proj>.weight` (+ `.bias` when `o_bias`), which the
  // measuring cores also receive as in.o_proj_weight. [B, T, hidden].
  at::Tensor attend_and_project(AttentionInputs in, const LayerRun& run, std::string_view o_proj,
                                bool o_bias, std::string_view prefix = "model.");
  // The text config the spec was built from, its errors naming the checkpoint's config.json:
  // a forward needs fields (norm eps, RoPE, biases) that the ModelSpec does not keep.
  ConfigReader text_config_reader() const;
  // The run's attention core (the measured or truncated one during calibration), else exact
  // attention at this model's chunk size.
  at::Tensor attend_core(const AttentionInputs& inputs, const LayerRun& run) const;

 private:
  ModelSpec spec_;
  std::shared_ptr<const io::Checkpoint> checkpoint_;
  ModelOptions options_;
  at::Device device_;
  at::ScalarType dtype_;
  std::map<int64_t, std::map<std::string, at::Tensor>> resident_;
  std::map<int64_t, std::vector<WeightRequirement>>
      layer_weights_;  // per layer, from required_weights()
  std::unique_ptr<LayerPrefetcher> prefetcher_;
  const std::vector<WeightRequirement>& weights_of(int64_t layer);
};

// The ModelFactory of an architecture whose model class is built from (spec, checkpoint, options).
template <class Model>
std::unique_ptr<DecoderModel> create_model_of(const ModelSpec& spec,
                                              std::shared_ptr<const io::Checkpoint> checkpoint,
                                              const ModelOptions& options) {
  return std::make_unique<Model>(spec, std::move(checkpoint), options);
}

// "[2, 16, 64]" for messages.
std::string shape_string(at::IntArrayRef shape);

at::ScalarType to_scalar_type(DType dtype);
DType from_scalar_type(at::ScalarType type);

// Zero-copy CPU view of a checkpoint tensor (keeps the mapping alive).
at::Tensor checkpoint_tensor(const std::shared_ptr<const io::Checkpoint>& checkpoint,
                             const std::string& name);

}  // namespace headwise::arch

#pragma once
// The shared body of the Qwen hybrid decoders (qwen3_next, qwen3_5_text): embeddings, the
// (1+w) RMSNorms, the gated full-attention layer, the gated-DeltaNet tail and the dense MLP.
// Subclasses supply the DeltaNet input projections (their weight layouts differ) and the
// feed-forward when it is MoE.
#include <string>
#include <vector>

#include "headwise/arch/gated_delta.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/qwen_hybrid_config.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {

class LayerWeights;

class QwenHybridModel : public DecoderModel {
 public:
  QwenHybridModel(const ModelSpec& spec, std::shared_ptr<const io::Checkpoint> checkpoint,
                  const ModelOptions& options, QwenHybridConfig config);

  at::Tensor embed(const at::Tensor& input_ids) override;
  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden, const LayerRun& run) override;
  at::Tensor logits(const at::Tensor& hidden) override;
  std::vector<WeightRequirement> required_weights() const override;

  const QwenHybridConfig& config() const { return config_; }
  // "model." or, for qwen3_5 wrapper checkpoints, "model.language_model." (probed at load).
  const std::string& weight_prefix() const { return prefix_; }

 protected:
  // x = input_layernorm(h), [B, T, H] → the DeltaNet inputs (projections, architecture-specific).
  virtual GatedDeltaInputs linear_projections(int64_t layer, const at::Tensor& x) = 0;
  virtual void add_linear_projection_weights(LayerWeights& layer) const = 0;
  // Feed-forward on post_attention_layernorm(h): the sparse MoE block on the config's MoE layers,
  // else a dense SwiGLU `mlp.{gate,up,down}_proj`.
  virtual at::Tensor feed_forward(int64_t layer, const at::Tensor& x);
  virtual void add_feed_forward_weights(LayerWeights& layer) const;

  // "<prefix>layers.<i>."
  std::string layer_prefix(int64_t layer) const;
  const at::Tensor& layer_weight(int64_t layer, const std::string& suffix) {
    return weight(layer, layer_prefix(layer) + suffix);
  }

 private:
  at::Tensor sparse_moe(int64_t layer, const at::Tensor& x);
  void add_sparse_moe_weights(LayerWeights& layer) const;
  bool has_fused_experts(int64_t layer) const;
  at::Tensor full_attention(int64_t layer, const at::Tensor& x, const LayerRun& run);
  at::Tensor linear_attention(int64_t layer, const at::Tensor& x, LayerState* state);
  void add_attention_weights(LayerWeights& layer) const;
  void add_linear_tail_weights(LayerWeights& layer) const;
  at::Tensor norm(const at::Tensor& x, const at::Tensor& weight) const;
  std::string lm_head_name() const;

  QwenHybridConfig config_;
  std::string prefix_;
  at::Tensor inv_freq_;
};

// The registry entry of a Qwen hybrid decoder whose model class is `Model`: the spec and the model
// read the text config alike, with `feed_forward` saying where its MoE layers are.
template <class Model>
Architecture qwen_hybrid_architecture(std::string name, std::string model_type,
                                      QwenFeedForward feed_forward) {
  return Architecture{
      .name = std::move(name),
      .model_types = {std::move(model_type)},
      .build_spec =
          [feed_forward](const ConfigReader& reader) {
            return qwen_hybrid_spec(read_qwen_hybrid_config(reader, feed_forward));
          },
      .create_model = [feed_forward](const ModelSpec& spec,
                                     std::shared_ptr<const io::Checkpoint> checkpoint,
                                     const ModelOptions& options) -> std::unique_ptr<DecoderModel> {
        const ConfigReader reader(spec.text_config, (checkpoint->dir() / "config.json").string());
        return std::make_unique<Model>(spec, std::move(checkpoint), options,
                                       read_qwen_hybrid_config(reader, feed_forward));
      },
  };
}

}  // namespace headwise::arch

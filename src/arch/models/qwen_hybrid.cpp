#include "headwise/arch/qwen_hybrid.hpp"

#include <cmath>

#include "headwise/arch/moe.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/arch/weight_list.hpp"
#include "headwise/core/error.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {

QwenHybridModel::QwenHybridModel(const ModelSpec& spec,
                                 std::shared_ptr<const io::Checkpoint> checkpoint,
                                 const ModelOptions& options, QwenHybridConfig config)
    : DecoderModel(spec, std::move(checkpoint), options), config_(std::move(config)) {
  // Qwen3.5 wrapper checkpoints (Qwen3_5ForConditionalGeneration) keep the text model under
  // model.language_model.; text-only saves use model. Probe which this checkpoint has.
  prefix_ = this->checkpoint().contains("model.language_model.embed_tokens.weight")
                ? "model.language_model."
                : "model.";
  inv_freq_ = config_.rope.rope_type == "yarn"
                  ? rope_inv_freq(config_.rope, config_.rotary_dim(), device())
                  : default_inv_freq(config_.rope_theta, config_.rotary_dim(), device());
}

std::string QwenHybridModel::layer_prefix(int64_t layer) const {
  return fmt::format("{}layers.{}.", prefix_, layer);
}

std::string QwenHybridModel::lm_head_name() const {
  return config_.tie_word_embeddings ? prefix_ + "embed_tokens.weight" : "lm_head.weight";
}

at::Tensor QwenHybridModel::norm(const at::Tensor& x, const at::Tensor& weight) const {
  return rms_norm(x, weight, config_.rms_norm_eps, NormStyle::kOnePlusWeight);
}

at::Tensor QwenHybridModel::embed(const at::Tensor& input_ids) {
  if (input_ids.dim() != 2)
    throw_input_error("input_ids must be [batch, tokens], got {}", shape_string(input_ids.sizes()));
  if (input_ids.numel() > 0) {
    const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= config_.vocab_size) {
      throw_input_error("token id {} is outside the vocabulary [0, {})", lo < 0 ? lo : hi,
                        config_.vocab_size);
    }
  }
  const at::Tensor& table = weight(-1, prefix_ + "embed_tokens.weight");
  return at::embedding(table, input_ids.to(device(), at::kLong));
}

at::Tensor QwenHybridModel::logits(const at::Tensor& hidden) {
  const at::Tensor normed = norm(hidden, weight(-1, prefix_ + "norm.weight"));
  return arch::linear(normed, weight(-1, lm_head_name())).to(at::kFloat);
}

at::Tensor QwenHybridModel::run_layer(int64_t layer, const at::Tensor& hidden,
                                      const LayerRun& run) {
  HEADWISE_CHECK(layer >= 0 && layer < config_.num_layers, "layer {} of {}", layer,
                 config_.num_layers);
  const at::Tensor mixer_in = norm(hidden, layer_weight(layer, "input_layernorm.weight"));
  const at::Tensor mixed =
      config_.layer_kinds[static_cast<size_t>(layer)] == LayerKind::kFullAttention
          ? full_attention(layer, mixer_in, run)
          : linear_attention(layer, mixer_in, run.state);
  const at::Tensor h = hidden + mixed;
  return h + feed_forward(layer, norm(h, layer_weight(layer, "post_attention_layernorm.weight")));
}

at::Tensor QwenHybridModel::full_attention(int64_t layer, const at::Tensor& x,
                                           const LayerRun& run) {
  const int64_t batch = x.size(0), steps = x.size(1), hd = config_.head_dim;
  // q_proj rows are per head [q (hd) | gate (hd)], not [all q | all gates].
  const auto q_and_gate = arch::linear(x, layer_weight(layer, "self_attn.q_proj.weight"))
                              .view({batch, steps, -1, 2 * hd})
                              .chunk(2, -1);
  at::Tensor q =
      norm(q_and_gate[0], layer_weight(layer, "self_attn.q_norm.weight")).transpose(1, 2);
  const at::Tensor k_raw =
      arch::linear(x, layer_weight(layer, "self_attn.k_proj.weight")).view({batch, steps, -1, hd});
  at::Tensor k = norm(k_raw, layer_weight(layer, "self_attn.k_norm.weight")).transpose(1, 2);
  const at::Tensor v = arch::linear(x, layer_weight(layer, "self_attn.v_proj.weight"))
                           .view({batch, steps, -1, hd})
                           .transpose(1, 2);
  if (run.position_offset < 0)
    throw_input_error("position offset {} is negative", run.position_offset);
  const RotaryTable table = rotary_table(inv_freq_, run.position_offset, steps,
                                         rope_attention_factor(config_.rope), x.scalar_type());
  q = apply_rotary(q, table);
  k = apply_rotary(k, table);

  AttentionInputs in;
  in.layer_id = layer;
  in.q = q;
  in.k = k;
  in.v = v;
  in.scaling = std::pow(static_cast<double>(hd), -0.5);
  in.position_offset = run.position_offset;
  in.output_gate = at::sigmoid(q_and_gate[1]);  // [B, T, nh, hd]
  in.o_proj_weight = layer_weight(layer, "self_attn.o_proj.weight");
  const at::Tensor attended = attend_core(in, run);  // [B, T, nh, hd]
  return arch::linear((attended * in.output_gate).reshape({batch, steps, -1}), in.o_proj_weight);
}

at::Tensor QwenHybridModel::linear_attention(int64_t layer, const at::Tensor& x,
                                             LayerState* state) {
  const GatedDeltaInputs inputs = linear_projections(layer, x);
  GatedDeltaWeights w;
  w.conv1d = layer_weight(layer, "linear_attn.conv1d.weight");
  w.A_log = layer_weight(layer, "linear_attn.A_log");
  w.dt_bias = layer_weight(layer, "linear_attn.dt_bias");
  w.norm = layer_weight(layer, "linear_attn.norm.weight");
  w.out_proj = layer_weight(layer, "linear_attn.out_proj.weight");
  return gated_delta_mixer(config_.linear, inputs, w, state);
}

at::Tensor QwenHybridModel::feed_forward(int64_t layer, const at::Tensor& x) {
  if (config_.is_moe_layer(layer)) return sparse_moe(layer, x);
  return gated_mlp(x, layer_weight(layer, "mlp.gate_proj.weight"),
                   layer_weight(layer, "mlp.up_proj.weight"),
                   layer_weight(layer, "mlp.down_proj.weight"));
}

// Qwen3-Next's sparse MoE block (also Qwen3.5-MoE's): router `mlp.gate`, experts per index or
// fused (transformers v5 layout), a shared expert scaled by sigmoid(`mlp.shared_expert_gate` x).
at::Tensor QwenHybridModel::sparse_moe(int64_t layer, const at::Tensor& x) {
  SparseMoeWeights w;
  w.router = layer_weight(layer, "mlp.gate.weight");
  w.shared_gate = layer_weight(layer, "mlp.shared_expert.gate_proj.weight");
  w.shared_up = layer_weight(layer, "mlp.shared_expert.up_proj.weight");
  w.shared_down = layer_weight(layer, "mlp.shared_expert.down_proj.weight");
  w.shared_expert_gate = layer_weight(layer, "mlp.shared_expert_gate.weight");
  const bool fused = has_fused_experts(layer);
  w.expert = [this, layer, fused](int64_t e) {
    ExpertWeights ew;
    if (fused) {
      ew.gate_up = layer_weight(layer, "mlp.experts.gate_up_proj").select(0, e);
      ew.down = layer_weight(layer, "mlp.experts.down_proj").select(0, e);
    } else {
      const std::string p = fmt::format("mlp.experts.{}.", e);
      ew.gate = layer_weight(layer, p + "gate_proj.weight");
      ew.up = layer_weight(layer, p + "up_proj.weight");
      ew.down = layer_weight(layer, p + "down_proj.weight");
    }
    return ew;
  };
  return sparse_moe_block(x, w, config_.num_experts_per_tok, config_.norm_topk_prob);
}

void QwenHybridModel::add_sparse_moe_weights(LayerWeights& layer) const {
  const int64_t h = config_.hidden_size, e = config_.num_experts, i = config_.moe_intermediate_size;
  layer.gated_mlp("mlp.shared_expert.", h, config_.shared_expert_intermediate_size);
  layer.add("mlp.gate.weight", {e, h});
  layer.add("mlp.shared_expert_gate.weight", {1, h});
  if (has_fused_experts(layer.index())) {
    // transformers v5 in-memory layout, as some converted checkpoints store it.
    layer.add("mlp.experts.gate_up_proj", {e, 2 * i, h});
    layer.add("mlp.experts.down_proj", {e, h, i});
    return;
  }
  for (int64_t x = 0; x < e; ++x) layer.gated_mlp(fmt::format("mlp.experts.{}.", x), h, i);
}

bool QwenHybridModel::has_fused_experts(int64_t layer) const {
  return checkpoint().contains(layer_prefix(layer) + "mlp.experts.gate_up_proj");
}

void QwenHybridModel::add_feed_forward_weights(LayerWeights& layer) const {
  if (config_.is_moe_layer(layer.index())) {
    add_sparse_moe_weights(layer);
  } else {
    layer.gated_mlp("mlp.", config_.hidden_size, config_.intermediate_size);
  }
}

void QwenHybridModel::add_attention_weights(LayerWeights& layer) const {
  const int64_t h = config_.hidden_size, hd = config_.head_dim;
  const int64_t nh = config_.num_heads, nkv = config_.num_kv_heads;
  layer.add("self_attn.q_proj.weight", {2 * nh * hd, h});  // per head [q | gate]
  layer.add("self_attn.k_proj.weight", {nkv * hd, h});
  layer.add("self_attn.v_proj.weight", {nkv * hd, h});
  layer.add("self_attn.o_proj.weight", {h, nh * hd});
  layer.add("self_attn.q_norm.weight", {hd});
  layer.add("self_attn.k_norm.weight", {hd});
}

void QwenHybridModel::add_linear_tail_weights(LayerWeights& layer) const {
  const GatedDeltaShape& s = config_.linear;
  layer.add("linear_attn.conv1d.weight", {s.conv_dim(), 1, s.conv_kernel});
  layer.add("linear_attn.A_log", {s.num_v_heads});
  layer.add("linear_attn.dt_bias", {s.num_v_heads});
  layer.add("linear_attn.norm.weight", {s.v_head_dim});
  layer.add("linear_attn.out_proj.weight", {config_.hidden_size, s.value_dim()});
}

std::vector<WeightRequirement> QwenHybridModel::required_weights() const {
  const int64_t h = config_.hidden_size, vocab = config_.vocab_size;
  WeightList weights(prefix_);
  weights.add(prefix_ + "embed_tokens.weight", {vocab, h}, -1);
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    LayerWeights layer = weights.layer(i);
    layer.add("input_layernorm.weight", {h});
    layer.add("post_attention_layernorm.weight", {h});
    if (config_.layer_kinds[static_cast<size_t>(i)] == LayerKind::kFullAttention) {
      add_attention_weights(layer);
    } else {
      add_linear_projection_weights(layer);
      add_linear_tail_weights(layer);
    }
    add_feed_forward_weights(layer);
  }
  // logits() reads these under layer -1, beside the embedding table.
  weights.add(prefix_ + "norm.weight", {h}, -1);
  if (!config_.tie_word_embeddings) weights.add("lm_head.weight", {vocab, h}, -1);
  return std::move(weights).take();
}

}  // namespace headwise::arch

#pragma once
// The config of the Qwen hybrid family (qwen3_next, qwen3_5_text and the qwen3_5 wrapper):
// gated-DeltaNet "linear_attention" layers interleaved with gated full-attention layers.
// Torch-free: the model spec (memory model, policy reader) is built from this alone.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/arch/rope_params.hpp"
#include "headwise/core/dtype.hpp"

namespace headwise::arch {

// Shape of one gated-DeltaNet mixer (HF Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet).
struct GatedDeltaShape {
  int64_t num_k_heads = 16;  // linear_num_key_heads (nk)
  int64_t num_v_heads = 32;  // linear_num_value_heads (nv), a multiple of nk
  int64_t k_head_dim = 128;  // linear_key_head_dim (dk)
  int64_t v_head_dim = 128;  // linear_value_head_dim (dv)
  int64_t conv_kernel = 4;   // linear_conv_kernel_dim (K)
  double eps = 1e-6;         // rms_norm_eps, used by the gated output norm

  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
  // Channels of the depthwise conv: [q | k | v].
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  // Value heads per key head (r): q and k heads are repeat_interleave'd r times.
  int64_t value_heads_per_key_head() const { return num_v_heads / num_k_heads; }
};

struct QwenHybridConfig {
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t num_layers = 0;
  std::vector<LayerKind> layer_kinds;  // kFullAttention or kLinearAttention per layer
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  DType dtype = DType::kBFloat16;  // checkpoint dtype: HF allocates the conv state in it

  // Gated full attention.
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 0.25;
  RopeParameters rope;  // "default" or "yarn" (over the rotary dims only, as HF computes it)
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }

  GatedDeltaShape linear;

  // Feed-forward. Dense SwiGLU of `intermediate_size` unless the layer is MoE.
  int64_t intermediate_size = 0;
  int64_t num_experts = 0;  // 0: every layer dense (qwen3_5_text)
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  int64_t decoder_sparse_step = 1;
  std::set<int64_t> mlp_only_layers;

  // HF Qwen3NextDecoderLayer: MoE iff not in mlp_only_layers, experts > 0 and
  // (i + 1) % decoder_sparse_step == 0.
  bool is_moe_layer(int64_t layer) const;
};

// Reads a qwen3_next (with_moe) or qwen3_5_text config. Accepts v5 `rope_parameters` and the
// legacy top-level `rope_theta` / `partial_rotary_factor`, and `layer_types` or
// `full_attention_interval` (HF default 4: layer i is full iff (i + 1) % 4 == 0).
// How the feed-forward of a qwen hybrid family is laid out.
enum class QwenFeedForward {
  kDense,       // qwen3_5_text: a SwiGLU MLP on every layer
  kSparseStep,  // qwen3_next: MoE on layers per decoder_sparse_step / mlp_only_layers, else dense
  kEveryLayerMoe,  // qwen3_5_moe_text: MoE (normalised top-k, shared expert) on every layer
};
QwenHybridConfig read_qwen_hybrid_config(const ConfigReader& reader, QwenFeedForward feed_forward);

// Per-layer spec: full layers get their attention shape; linear layers their decode state,
// shaped and typed as HF's LinearAttentionLayer cache allocates it: the last K conv inputs
// [conv_dim, K] in the model dtype and the recurrent state [nv, dk, dv] in float32.
ModelSpec qwen_hybrid_spec(const QwenHybridConfig& config);

}  // namespace headwise::arch

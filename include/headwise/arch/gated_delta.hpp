#pragma once
// Gated DeltaNet (Qwen3-Next / Qwen3.5 "linear_attention" layers), following HF's torch
// fallbacks op for op — causal_conv1d_fn / causal_conv1d_update, torch_chunk_gated_delta_rule,
// torch_recurrent_gated_delta_rule, RMSNormGated — so fp32 and bf16 numerics match transformers.
#include <ATen/ATen.h>

#include "headwise/arch/model.hpp"
#include "headwise/arch/qwen_hybrid_config.hpp"

namespace headwise::arch {

// x * rsqrt(sum(x^2) + eps) over the last dim (FLA's l2norm, as HF copies it).
at::Tensor l2norm(const at::Tensor& x, double eps = 1e-6);

// Depthwise causal conv. x [B, C, T], weight [C, 1, K], bias [C] or undefined → [B, C, T] in the
// weight's dtype. `conv_state` [B, C, K] (null: fresh sequence, nothing kept): when defined it
// holds the last K inputs before x and is continued from; on return it holds the last K inputs
// including x (left zero-padded when fewer were seen), as HF's conv caches store it. Shared by
// the gated DeltaNet and LFM2's short convolutions.
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         at::Tensor* conv_state);
// The same without bias, then SiLU, in x's dtype (the gated DeltaNet's).
at::Tensor causal_conv1d_silu(const at::Tensor& x, const at::Tensor& weight,
                              at::Tensor* conv_state);

// The caller's state tensor `name` (batch first), checked against `expected`; undefined when the
// map is null or lacks it (a fresh sequence).
at::Tensor find_layer_state(const LayerState* state, const char* name,
                            std::vector<int64_t> expected);
// Writes a final state into the caller's map: into the existing tensor when it has the same
// shape (the runtime's buffer keeps its address and dtype), else as a new entry.
void store_layer_state(LayerState& state, const char* name, const at::Tensor& value);

struct DeltaRuleOutput {
  at::Tensor out;          // [B, T, nv, dv] in q's dtype
  at::Tensor final_state;  // [B, nv, dk, dv] float32
};

// q, k [B, T, nv, dk] (already repeated over value heads), v [B, T, nv, dv], g (log decay) and
// beta [B, T, nv]. q and k are l2-normalised in fp32 here, q scaled by dk^-1/2. Chunked form
// (workspace O(T * chunk) per head, never T x T; a run shorter than `max_chunk` is one chunk);
// `initial_state` [B, nv, dk, dv] or undefined.
DeltaRuleOutput chunk_gated_delta_rule(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& g,
                                       const at::Tensor& beta, const at::Tensor& initial_state,
                                       int64_t max_chunk = 64);
// Token-by-token form HF uses for single-token cached decode. Same arguments.
DeltaRuleOutput recurrent_gated_delta_rule(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& g,
                                           const at::Tensor& beta, const at::Tensor& initial_state);

// HF RMSNormGated: norm first, `w * x̂.to(dtype)`, then times silu(gate) in fp32, cast back.
at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight,
                          double eps);

// The projections differ between qwen3_next (grouped qkvz/ba) and qwen3_5 (separate, plain);
// everything after them is shared.
struct GatedDeltaInputs {
  at::Tensor mixed_qkv;  // [B, T, conv_dim] in [q (nk*dk) | k (nk*dk) | v (nv*dv)] order
  at::Tensor z;          // [B, T, nv, dv] output gate
  at::Tensor b;          // [B, T, nv] → beta = sigmoid(b)
  at::Tensor a;          // [B, T, nv] → decay
};

struct GatedDeltaWeights {
  at::Tensor conv1d;    // [conv_dim, 1, K]
  at::Tensor A_log;     // [nv]
  at::Tensor dt_bias;   // [nv]
  at::Tensor norm;      // [dv]
  at::Tensor out_proj;  // [H, nv*dv]
};

// conv → split → (beta, g) → delta rule → gated norm → out_proj: [B, T, H].
// `state` (nullable) holds "conv_state" [B, conv_dim, K] and "recurrent_state" [B, nv, dk, dv];
// present entries are the initial state, and the final states are written back (into the
// existing tensors when present, keeping their dtype; else new: conv in x's dtype, recurrent fp32).
at::Tensor gated_delta_mixer(const GatedDeltaShape& shape, const GatedDeltaInputs& in,
                             const GatedDeltaWeights& w, LayerState* state);

}  // namespace headwise::arch

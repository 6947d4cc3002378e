#include "headwise/arch/gated_delta.hpp"

#include <cmath>
#include <limits>

#include "headwise/arch/ops.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

// Depthwise conv1d, as HF's F.conv1d(..., groups=channels) (bias optional).
at::Tensor depthwise_conv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          int64_t padding) {
  const std::vector<int64_t> stride{1}, pad{padding}, dilation{1};
  return at::conv1d(x, weight, bias, stride, pad, dilation, x.size(1));
}

// [B, T, h, d] (or [B, T, h]) → [B, h, T, ...] float32, contiguous: the layout both HF rules use.
at::Tensor heads_first_fp32(const at::Tensor& x) {
  return x.transpose(1, 2).to(at::kFloat).contiguous();
}

}  // namespace

// Writes a final state into the caller's map: into the existing tensor when it has the same
// shape (the runtime's buffer keeps its address and dtype), else as a new entry.
void store_layer_state(LayerState& state, const char* name, const at::Tensor& value) {
  auto it = state.find(name);
  if (it != state.end() && it->second.defined() && it->second.sizes() == value.sizes()) {
    it->second.copy_(value);
  } else {
    state[name] = value;
  }
}

// The caller's initial state, checked against the shape the spec declares (batch first).
at::Tensor find_layer_state(const LayerState* state, const char* name,
                            std::vector<int64_t> expected) {
  if (state == nullptr) return {};
  const auto it = state->find(name);
  if (it == state->end() || !it->second.defined()) return {};
  if (it->second.sizes() != at::IntArrayRef(expected)) {
    throw_input_error("layer state '{}' has shape {}, expected {}", name,
                      shape_string(it->second.sizes()), shape_string(expected));
  }
  return it->second;
}

at::Tensor l2norm(const at::Tensor& x, double eps) {
  return x * at::rsqrt((x * x).sum(-1, /*keepdim=*/true) + eps);
}

at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         at::Tensor* conv_state) {
  const int64_t channels = x.size(1), steps = x.size(2), kernel = weight.size(-1);
  HEADWISE_CHECK(weight.size(0) == channels, "conv weight {} for {} channels",
                 shape_string(weight.sizes()), channels);
  const at::Tensor b = bias.defined() ? bias.to(weight.scalar_type()) : bias;
  at::Tensor out;
  at::Tensor window;  // the inputs the conv sees, for the state update
  if (conv_state != nullptr && conv_state->defined()) {
    // HF (update_conv_state + causal_conv1d_fn / causal_conv1d_update): the kept inputs are
    // prepended, and only the outputs of the new positions are kept.
    window = at::cat({conv_state->to(x.scalar_type()), x}, -1);
    out = depthwise_conv(window.to(weight.scalar_type()), weight, b, 0).slice(-1, -steps);
  } else {
    out = depthwise_conv(x.to(weight.scalar_type()), weight, b, kernel - 1).slice(-1, 0, steps);
    window = steps < kernel ? at::constant_pad_nd(x, {kernel - steps, 0}) : x;
  }
  if (conv_state != nullptr) *conv_state = window.slice(-1, window.size(-1) - kernel).contiguous();
  return out;
}

at::Tensor causal_conv1d_silu(const at::Tensor& x, const at::Tensor& weight,
                              at::Tensor* conv_state) {
  return at::silu(causal_conv1d(x, weight, at::Tensor(), conv_state)).to(x.scalar_type());
}

DeltaRuleOutput chunk_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in,
                                       const at::Tensor& v_in, const at::Tensor& g_in,
                                       const at::Tensor& beta_in, const at::Tensor& initial_state,
                                       int64_t max_chunk) {
  const at::ScalarType out_dtype = q_in.scalar_type();
  const int64_t batch = k_in.size(0), steps = k_in.size(1), k_dim = k_in.size(3);
  // A run shorter than one chunk is one chunk of its own length: the same arithmetic without the
  // padding, whose intra-chunk products grow with the chunk's square (the answer span's short
  // runs through every layer above a measured one, small prefill chunks).
  const int64_t chunk = std::max<int64_t>(1, std::min(max_chunk, steps));
  const int64_t heads = v_in.size(2), v_dim = v_in.size(3);
  at::Tensor query = l2norm(heads_first_fp32(q_in));
  at::Tensor key = l2norm(heads_first_fp32(k_in));
  at::Tensor value = heads_first_fp32(v_in);
  at::Tensor beta = heads_first_fp32(beta_in);
  at::Tensor decay = heads_first_fp32(g_in);
  query = query * std::pow(static_cast<double>(k_dim), -0.5);

  // Pad T to a multiple of the chunk; padded steps have zero k, v, beta and log-decay.
  const int64_t pad = (chunk - steps % chunk) % chunk;
  query = at::constant_pad_nd(query, {0, 0, 0, pad});
  key = at::constant_pad_nd(key, {0, 0, 0, pad});
  value = at::constant_pad_nd(value, {0, 0, 0, pad});
  beta = at::constant_pad_nd(beta, {0, pad});
  decay = at::constant_pad_nd(decay, {0, pad});
  const int64_t chunks = (steps + pad) / chunk;

  const at::Tensor v_beta =
      (value * beta.unsqueeze(-1)).reshape({batch, heads, chunks, chunk, v_dim});
  const at::Tensor k_beta =
      (key * beta.unsqueeze(-1)).reshape({batch, heads, chunks, chunk, k_dim});
  query = query.reshape({batch, heads, chunks, chunk, k_dim});
  key = key.reshape({batch, heads, chunks, chunk, k_dim});
  const at::Tensor cum = decay.reshape({batch, heads, chunks, chunk}).cumsum(3);

  // Intra-chunk pairwise decay exp(cum_i - cum_j) for j <= i, zero above the diagonal.
  const at::Tensor upper =
      at::ones({chunk, chunk}, at::TensorOptions().dtype(at::kBool).device(q_in.device())).triu(1);
  const at::Tensor pairwise = (cum.unsqueeze(4) - cum.unsqueeze(3))
                                  .masked_fill(upper, -std::numeric_limits<float>::infinity())
                                  .exp();
  const at::Tensor ut_system = at::matmul(k_beta, key.transpose(-1, -2)) * pairwise;
  const at::Tensor intra = at::matmul(query, key.transpose(-1, -2)) * pairwise;
  const at::Tensor decayed_k_beta = k_beta * cum.exp().unsqueeze(-1);
  // UT transform: (I + strictly-lower(ut)) X = rhs, as HF's solve_triangular(unitriangular).
  const at::Tensor new_values =
      at::linalg_solve_triangular(ut_system, v_beta, /*upper=*/false, /*left=*/true, true);
  const at::Tensor k_cumdecay =
      at::linalg_solve_triangular(ut_system, decayed_k_beta, false, true, true);

  at::Tensor state = initial_state.defined()
                         ? initial_state.to(new_values.options())
                         : at::zeros({batch, heads, k_dim, v_dim}, new_values.options());
  at::Tensor out = at::zeros_like(new_values);
  query = query * cum.exp().unsqueeze(-1);
  key = key * (cum.slice(-1, chunk - 1) - cum).exp().unsqueeze(-1);
  const at::Tensor chunk_decay =
      cum.select(-1, chunk - 1).exp().unsqueeze(-1).unsqueeze(-1);  // [B, h, N, 1, 1]
  for (int64_t i = 0; i < chunks; ++i) {
    const at::Tensor v_new = new_values.select(2, i) - at::matmul(k_cumdecay.select(2, i), state);
    const at::Tensor inter = at::matmul(query.select(2, i), state);
    out.select(2, i).copy_(inter + at::matmul(intra.select(2, i), v_new));
    state =
        state * chunk_decay.select(2, i) + at::matmul(key.select(2, i).transpose(-1, -2), v_new);
  }
  out = out.reshape({batch, heads, -1, v_dim}).slice(2, 0, steps);
  return {out.transpose(1, 2).to(out_dtype).contiguous(), state};
}

DeltaRuleOutput recurrent_gated_delta_rule(const at::Tensor& q_in, const at::Tensor& k_in,
                                           const at::Tensor& v_in, const at::Tensor& g_in,
                                           const at::Tensor& beta_in,
                                           const at::Tensor& initial_state) {
  const at::ScalarType out_dtype = q_in.scalar_type();
  const int64_t batch = k_in.size(0), steps = k_in.size(1), k_dim = k_in.size(3);
  const int64_t heads = v_in.size(2), v_dim = v_in.size(3);
  at::Tensor query = l2norm(heads_first_fp32(q_in));
  const at::Tensor key = l2norm(heads_first_fp32(k_in));
  const at::Tensor value = heads_first_fp32(v_in);
  const at::Tensor beta = heads_first_fp32(beta_in);
  const at::Tensor decay = heads_first_fp32(g_in);
  query = query / std::pow(static_cast<double>(k_dim), 0.5);

  at::Tensor state = initial_state.defined()
                         ? initial_state.to(value.options())
                         : at::zeros({batch, heads, k_dim, v_dim}, value.options());
  at::Tensor out = at::zeros_like(value);
  for (int64_t t = 0; t < steps; ++t) {
    const at::Tensor q_t = query.select(2, t), k_t = key.select(2, t), v_t = value.select(2, t);
    state = state * decay.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor kv_mem = (state * k_t.unsqueeze(-1)).sum(-2);
    const at::Tensor delta = (v_t - kv_mem) * beta.select(2, t).unsqueeze(-1);
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    out.select(2, t).copy_((state * q_t.unsqueeze(-1)).sum(-2));
  }
  return {out.transpose(1, 2).contiguous().to(out_dtype), state};
}

at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight,
                          double eps) {
  const at::ScalarType dtype = x.scalar_type();
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  h = weight * h.to(dtype);
  h = h * at::silu(gate.to(at::kFloat));
  return h.to(dtype);
}

at::Tensor gated_delta_mixer(const GatedDeltaShape& shape, const GatedDeltaInputs& in,
                             const GatedDeltaWeights& w, LayerState* state) {
  const int64_t batch = in.mixed_qkv.size(0), steps = in.mixed_qkv.size(1);
  at::Tensor conv_state =
      find_layer_state(state, "conv_state", {batch, shape.conv_dim(), shape.conv_kernel});
  at::Tensor recurrent_state = find_layer_state(
      state, "recurrent_state", {batch, shape.num_v_heads, shape.k_head_dim, shape.v_head_dim});

  const at::Tensor conv_out = causal_conv1d_silu(in.mixed_qkv.transpose(1, 2), w.conv1d,
                                                 state != nullptr ? &conv_state : nullptr)
                                  .transpose(1, 2);
  const int64_t kd = shape.key_dim();
  at::Tensor query = conv_out.slice(-1, 0, kd).reshape({batch, steps, -1, shape.k_head_dim});
  at::Tensor key = conv_out.slice(-1, kd, 2 * kd).reshape({batch, steps, -1, shape.k_head_dim});
  const at::Tensor value = conv_out.slice(-1, 2 * kd).reshape({batch, steps, -1, shape.v_head_dim});

  const at::Tensor beta = in.b.sigmoid();
  // Log-decay in fp32 (HF: "if the model is loaded in fp16, without the .float() here, A might be
  // -inf").
  const at::Tensor g =
      -w.A_log.to(at::kFloat).exp() * at::softplus(in.a.to(at::kFloat) + w.dt_bias);
  const int64_t r = shape.value_heads_per_key_head();
  if (r > 1) {
    query = query.repeat_interleave(r, 2);
    key = key.repeat_interleave(r, 2);
  }
  // HF takes the token-by-token rule only for single-token steps that continue a cached state.
  const DeltaRuleOutput rule =
      (recurrent_state.defined() && steps == 1)
          ? recurrent_gated_delta_rule(query, key, value, g, beta, recurrent_state)
          : chunk_gated_delta_rule(query, key, value, g, beta, recurrent_state);
  if (state != nullptr) {
    store_layer_state(*state, "conv_state", conv_state);
    store_layer_state(*state, "recurrent_state", rule.final_state);
  }
  const at::Tensor normed = gated_rms_norm(rule.out.reshape({-1, shape.v_head_dim}),
                                           in.z.reshape({-1, shape.v_head_dim}), w.norm, shape.eps);
  return arch::linear(normed.reshape({batch, steps, -1}), w.out_proj);
}

}  // namespace headwise::arch

#include "headwise/arch/mamba2.hpp"

#include "headwise/arch/gated_delta.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

// [B, T, ...] → [B, T + pad, ...] with zeros at the end (HF's pad_tensor_by_size).
at::Tensor pad_time(const at::Tensor& x, int64_t pad) {
  if (pad == 0) return x;
  // constant_pad_nd pairs run from the last dimension back: zeros for dims 2.., then (0, pad) for
  // dim 1.
  std::vector<int64_t> padding(static_cast<size_t>(2 * (x.dim() - 2)), 0);
  padding.push_back(0);
  padding.push_back(pad);
  return at::constant_pad_nd(x, padding);
}

// [B, T, ...] → [B, T / chunk, chunk, ...] after padding (HF's reshape_into_chunks).
at::Tensor into_chunks(const at::Tensor& x, int64_t pad, int64_t chunk) {
  const at::Tensor padded = pad_time(x, pad);
  std::vector<int64_t> shape{padded.size(0), -1, chunk};
  for (int64_t d = 2; d < padded.dim(); ++d) shape.push_back(padded.size(d));
  return padded.reshape(shape);
}

// HF's segment_sum: out[..., i, j] = sum_{j < k <= i} x[..., k] below the diagonal, -inf above.
at::Tensor segment_sum(const at::Tensor& x) {
  const int64_t n = x.size(-1);
  const auto bool_opts = at::TensorOptions().dtype(at::kBool).device(x.device());
  std::vector<int64_t> expanded = x.sizes().vec();
  expanded.push_back(n);
  at::Tensor t = x.unsqueeze(-1).expand(expanded);
  t = t.masked_fill(at::tril(at::ones({n, n}, bool_opts), -1).logical_not(), 0);
  t = at::cumsum(t, -2);
  return t.masked_fill(at::tril(at::ones({n, n}, bool_opts), 0).logical_not(),
                       -std::numeric_limits<double>::infinity());
}

struct ScanResult {
  at::Tensor out;          // [B, T, heads, head_dim] fp32
  at::Tensor final_state;  // [B, heads, head_dim, N] fp32
};

// mamba2_chunk_scan (transformers' torch fallback), with dt already discretised (bias, softplus,
// clamp) and A = -exp(A_log).
ScanResult chunk_scan(at::Tensor x, const at::Tensor& dt, const at::Tensor& A, at::Tensor B,
                      at::Tensor C, const at::Tensor& D, int64_t chunk,
                      const at::Tensor& initial_state) {
  const int64_t batch = x.size(0), steps = x.size(1), heads = x.size(2), head_dim = x.size(3);
  const int64_t groups = B.size(2);
  x = x.to(at::kFloat);
  B = B.to(at::kFloat).repeat_interleave(heads / groups, 2);
  C = C.to(at::kFloat).repeat_interleave(heads / groups, 2);
  const int64_t pad = (chunk - steps % chunk) % chunk;
  const at::Tensor d_residual = D.unsqueeze(-1) * pad_time(x, pad);
  x = x * dt.unsqueeze(-1).to(at::kFloat);
  at::Tensor a = A.to(at::kFloat) * dt.to(at::kFloat);
  x = into_chunks(x, pad, chunk);
  a = into_chunks(a, pad, chunk);
  B = into_chunks(B, pad, chunk);
  C = into_chunks(C, pad, chunk);
  a = a.permute({0, 3, 1, 2});  // [B, H, chunks, chunk]
  const at::Tensor a_cumsum = at::cumsum(a, -1);
  // 1. Intra-chunk outputs (the diagonal blocks).
  const at::Tensor L = at::exp(segment_sum(a));
  const at::Tensor G = (C.unsqueeze(3) * B.unsqueeze(2)).sum(-1);
  const at::Tensor M = (G.unsqueeze(-1) * L.permute({0, 2, 3, 4, 1}).unsqueeze(-1)).sum(-1);
  const at::Tensor y_diag = (M.unsqueeze(-1) * x.unsqueeze(2)).sum(3);
  // 2. Each chunk's final state from its own inputs.
  const at::Tensor decay_states = at::exp(a_cumsum.slice(-1, -1) - a_cumsum);
  const at::Tensor b_decay = B * decay_states.permute({0, 2, 3, 1}).unsqueeze(-1);
  at::Tensor states = (b_decay.unsqueeze(-2) * x.unsqueeze(-1)).sum(2);
  // 3. The recurrence between chunks.
  const at::Tensor previous = initial_state.defined()
                                  ? initial_state.unsqueeze(1).to(states.scalar_type())
                                  : at::zeros_like(states.slice(1, 0, 1));
  states = at::cat({previous, states}, 1);
  const at::Tensor decay_chunk =
      at::exp(segment_sum(at::constant_pad_nd(a_cumsum.select(-1, -1), {1, 0}))).transpose(1, 3);
  const at::Tensor new_states =
      (decay_chunk.unsqueeze(-1).unsqueeze(-1) * states.unsqueeze(2)).sum(1);
  const at::Tensor final_state = new_states.select(1, -1);
  states = new_states.slice(1, 0, -1);
  // 4. Each chunk's output from the state entering it.
  const at::Tensor state_decay_out = at::exp(a_cumsum);
  const at::Tensor c_times_states = C.unsqueeze(-2) * states.unsqueeze(2);
  const at::Tensor y_off =
      c_times_states.sum(-1) * state_decay_out.permute({0, 2, 3, 1}).unsqueeze(-1);
  at::Tensor out = (y_diag + y_off).reshape({batch, -1, heads, head_dim}) + d_residual;
  if (pad > 0) out = out.slice(1, 0, steps);
  return {out, final_state};
}

// mamba2_selective_state_update: one token, state [B, H, hd, N] fp32 updated in place.
at::Tensor recurrent_step(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A,
                          const at::Tensor& B, const at::Tensor& C, const at::Tensor& D,
                          at::Tensor& state) {
  const int64_t batch = x.size(0), heads = x.size(2), head_dim = x.size(3), groups = B.size(2),
                n = B.size(3);
  const at::Tensor xs = x.squeeze(1);  // [B, H, hd]
  const at::Tensor d =
      dt.squeeze(1).unsqueeze(-1).expand({batch, heads, head_dim}).unsqueeze(-1);  // [B, H, hd, 1]
  const at::Tensor dA = at::exp(d.to(at::kFloat) * A.to(at::kFloat).view({1, heads, 1, 1}));
  const at::Tensor b = B.squeeze(1)
                           .unsqueeze(2)
                           .expand({batch, groups, heads / groups, n})
                           .reshape({batch, heads, 1, n});
  const at::Tensor dBx = (d * b) * xs.unsqueeze(-1);
  const at::Tensor next = state * dA + dBx;
  state = next.to(at::kFloat);
  const at::Tensor c = C.squeeze(1)
                           .unsqueeze(2)
                           .expand({batch, groups, heads / groups, n})
                           .reshape({batch * heads, n, 1});
  at::Tensor out = at::bmm(next.to(c.scalar_type()).reshape({batch * heads, head_dim, n}), c)
                       .view({batch, heads, head_dim});
  out = (out + xs * D.view({1, heads, 1})).to(out.scalar_type());
  return out.to(x.scalar_type()).unsqueeze(1);
}

// BambaRMSNormGated / MambaRMSNormGated / FalconH1RMSNormGated: x * silu(gate) in fp32 (before
// or after the norm, or alone), RMS over groups of channels.
at::Tensor gated_norm(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& weight,
                      double eps, int64_t groups, Mamba2Options::Gate where) {
  const at::ScalarType dtype = x.scalar_type();
  const at::Tensor silu_gate = at::silu(gate.to(at::kFloat));
  at::Tensor h = x.to(at::kFloat);
  if (where == Mamba2Options::Gate::kWithoutNorm) return h * silu_gate;
  if (where == Mamba2Options::Gate::kThenNorm) h = h * silu_gate;
  const auto sizes = h.sizes().vec();
  if (groups > 1) {
    std::vector<int64_t> grouped(sizes.begin(), sizes.end() - 1);
    grouped.push_back(groups);
    grouped.push_back(-1);
    h = h.view(grouped);
  }
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (groups > 1) h = h.view(sizes);
  if (where == Mamba2Options::Gate::kAfterNorm) return (weight * h) * silu_gate;
  return weight * h.to(dtype);
}

}  // namespace

at::Tensor mamba2_mixer(const Mamba2Shape& s, const Mamba2Options& o, const at::Tensor& projected,
                        const Mamba2Weights& w, LayerState* state) {
  const int64_t batch = projected.size(0), steps = projected.size(1);
  const int64_t conv_dim = s.intermediate + 2 * s.groups * s.state_size;
  HEADWISE_CHECK(projected.size(2) == s.intermediate + conv_dim + s.heads,
                 "mamba2 in_proj width {} for {}", projected.size(2),
                 s.intermediate + conv_dim + s.heads);
  const at::ScalarType dtype = projected.scalar_type();
  const auto parts = projected.split_with_sizes({s.intermediate, conv_dim, s.heads}, -1);
  const at::Tensor& gate = parts[0];
  at::Tensor conv_state = find_layer_state(state, "conv_state", {batch, conv_dim, s.conv_kernel});
  at::Tensor ssm_state =
      find_layer_state(state, "ssm_state", {batch, s.heads, s.head_dim, s.state_size});
  const bool continues = ssm_state.defined();
  const at::Tensor xbc = at::silu(causal_conv1d(parts[1].transpose(1, 2), w.conv1d, w.conv_bias,
                                                state != nullptr ? &conv_state : nullptr))
                             .to(dtype)
                             .transpose(1, 2);
  const auto xbc_parts =
      xbc.split_with_sizes({s.intermediate, s.groups * s.state_size, s.groups * s.state_size}, -1);
  const at::Tensor x = xbc_parts[0].reshape({batch, steps, s.heads, s.head_dim});
  const at::Tensor B = xbc_parts[1].reshape({batch, steps, s.groups, s.state_size});
  const at::Tensor C = xbc_parts[2].reshape({batch, steps, s.groups, s.state_size});
  const at::Tensor A = -at::exp(w.A_log.to(at::kFloat));
  at::Tensor dt = at::softplus(parts[2] + w.dt_bias.to(parts[2].scalar_type()));
  at::Tensor scan;
  if (continues && steps == 1) {  // HF: the recurrent form only continues a cached state
    ssm_state = ssm_state.to(at::kFloat);
    scan = recurrent_step(x, dt, A, B, C, w.D, ssm_state).reshape({batch, steps, -1});
  } else {
    dt = at::clamp(dt, o.dt_min, o.dt_max);
    ScanResult r =
        chunk_scan(x, dt, A, B, C, w.D, o.chunk_size, continues ? ssm_state : at::Tensor());
    scan = r.out.reshape({batch, steps, -1});
    ssm_state = r.final_state;
  }
  if (state != nullptr) {
    store_layer_state(*state, "conv_state", conv_state);
    store_layer_state(*state, "ssm_state", ssm_state);
  }
  const at::Tensor normed = gated_norm(scan, gate, w.norm, o.norm_eps, o.norm_groups, o.gate);
  return w.out_bias.defined() ? arch::linear(normed.to(dtype), w.out_proj, w.out_bias)
                              : arch::linear(normed.to(dtype), w.out_proj);
}

Mamba2Options read_bamba_mixer_options(const ConfigReader& config, double norm_eps) {
  Mamba2Options o;
  o.chunk_size = config.get_positive_int("mamba_chunk_size", 256);
  o.norm_eps = norm_eps;
  if (config.has("time_step_limit") && config.get("time_step_limit").is_array() &&
      config.get("time_step_limit").size() == 2) {
    const auto& limit = config.get("time_step_limit");
    if (limit[0].is_number()) o.dt_min = limit[0].get<double>();
    if (limit[1].is_number()) o.dt_max = limit[1].get<double>();
  }
  return o;
}

Mamba2Weights mamba2_weights(const std::function<const at::Tensor&(const std::string&)>& get,
                             const std::string& module, bool conv_bias, bool proj_bias, bool norm) {
  Mamba2Weights m;
  m.conv1d = get(module + "conv1d.weight");
  if (conv_bias) m.conv_bias = get(module + "conv1d.bias");
  m.dt_bias = get(module + "dt_bias");
  m.A_log = get(module + "A_log");
  m.D = get(module + "D");
  if (norm) m.norm = get(module + "norm.weight");
  m.out_proj = get(module + "out_proj.weight");
  if (proj_bias) m.out_bias = get(module + "out_proj.bias");
  return m;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> mamba2_weight_shapes(
    const Mamba2Shape& s, int64_t hidden, bool conv_bias, bool proj_bias, bool norm,
    std::optional<bool> out_bias) {
  const int64_t conv_dim = s.intermediate + 2 * s.groups * s.state_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes{
      {"in_proj.weight", {s.intermediate + conv_dim + s.heads, hidden}},
      {"conv1d.weight", {conv_dim, 1, s.conv_kernel}},
      {"dt_bias", {s.heads}},
      {"A_log", {s.heads}},
      {"D", {s.heads}},
      {"out_proj.weight", {hidden, s.intermediate}}};
  if (norm) shapes.push_back({"norm.weight", {s.intermediate}});
  if (conv_bias) shapes.push_back({"conv1d.bias", {conv_dim}});
  if (proj_bias) shapes.push_back({"in_proj.bias", {s.intermediate + conv_dim + s.heads}});
  if (out_bias.value_or(proj_bias)) shapes.push_back({"out_proj.bias", {hidden}});
  return shapes;
}

}  // namespace headwise::arch

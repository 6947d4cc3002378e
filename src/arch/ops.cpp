#include "headwise/arch/ops.hpp"

#include "headwise/core/error.hpp"

namespace headwise::arch {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormStyle style) {
  const at::ScalarType dtype = x.scalar_type();
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  switch (style) {
    case NormStyle::kScaleAfterCast: return weight * normed.to(dtype);
    case NormStyle::kOnePlusWeight: return (normed * (1.0 + weight.to(at::kFloat))).to(dtype);
    case NormStyle::kScaleInFp32: return (weight.to(at::kFloat) * normed).to(dtype);
  }
  HEADWISE_CHECK(false, "unknown norm style");
}

at::Tensor default_inv_freq(double base, int64_t dim, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor exponent = at::arange(0, dim, 2, opts).to(at::kFloat) / static_cast<double>(dim);
  return 1.0 / at::pow(base, exponent);
}

RotaryTable rotary_table(const at::Tensor& inv_freq, int64_t offset, int64_t steps, double attention_factor,
                         at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(inv_freq.device());
  const at::Tensor positions = at::arange(offset, offset + steps, opts).to(at::kFloat);
  // Same op order as HF: (inv_freq[:, None] @ positions[None, :]).T, then cat(freqs, freqs).
  const at::Tensor freqs = at::matmul(inv_freq.to(at::kFloat).view({-1, 1}), positions.view({1, -1})).transpose(0, 1);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  RotaryTable table;
  table.cos = (emb.cos() * attention_factor).to(dtype);
  table.sin = (emb.sin() * attention_factor).to(dtype);
  table.rotary_dim = emb.size(-1);
  return table;
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table) {
  const int64_t rd = table.rotary_dim;
  HEADWISE_CHECK(rd <= x.size(-1) && rd % 2 == 0, "rotary dim {} for head dim {}", rd, x.size(-1));
  const at::Tensor rot = x.slice(-1, 0, rd);
  const at::Tensor half1 = rot.slice(-1, 0, rd / 2);
  const at::Tensor half2 = rot.slice(-1, rd / 2, rd);
  const at::Tensor rotated_half = at::cat({-half2, half1}, -1);
  const at::Tensor out = rot * table.cos + rotated_half * table.sin;
  if (rd == x.size(-1)) return out;
  return at::cat({out, x.slice(-1, rd)}, -1);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

at::Tensor pre_norm_residual(const at::Tensor& x, const at::Tensor& first_norm, const at::Tensor& second_norm,
                             double eps, NormStyle style, const std::function<at::Tensor(const at::Tensor&)>& mixer,
                             const std::function<at::Tensor(const at::Tensor&)>& feed_forward) {
  const at::Tensor h = x + mixer(rms_norm(x, first_norm, eps, style));
  return h + feed_forward(rms_norm(h, second_norm, eps, style));
}

at::Tensor silu(const at::Tensor& x) { return at::silu(x); }

at::Tensor gelu_tanh(const at::Tensor& x) { return at::gelu(x, "tanh"); }

at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                     bool gelu) {
  const at::Tensor g = arch::linear(x, gate);
  return arch::linear((gelu ? arch::gelu_tanh(g) : arch::silu(g)) * arch::linear(x, up), down);
}

}  // namespace headwise::arch

#include "headwise/arch/ops.hpp"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"

namespace headwise::arch {
namespace {

int64_t rows_of(const at::Tensor& t) {
  return t.numel() / std::max<int64_t>(t.size(-1), 1);
}

at::Tensor pinned_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  // Small products on one MKL thread: their bits would depend on the thread count otherwise.
  const SmallGemmOnOneThread pinned(rows_of(x), weight.size(0), x.is_cpu());
  return bias.defined() ? at::linear(x, weight, bias) : at::linear(x, weight);
}

// at::linear whose backward products are pinned like its forward: answer-grad and duo's gate
// training back-propagate through the layers, and autograd's own linear backward would run
// grad @ weight ([tokens, in]: small on small models) on every MKL thread. The bias is a constant
// (nothing here trains one; linear() does not take this path for a bias that needs a gradient).
struct PinnedLinear : public torch::autograd::Function<PinnedLinear> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, weight});
    return pinned_linear(x, weight, bias.value_or(at::Tensor()));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& g = grads[0];
    at::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {
      const SmallGemmOnOneThread pinned(rows_of(g), weight.size(1), g.is_cpu());
      gx = at::matmul(g, weight);
    }
    const at::Tensor g2 = g.reshape({-1, g.size(-1)});
    if (ctx->needs_input_grad(1)) {
      const SmallGemmOnOneThread pinned(weight.size(0), weight.size(1), g.is_cpu());
      gw = at::matmul(g2.t(), x.reshape({-1, x.size(-1)}));
    }
    return {gx, gw, at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormStyle style) {
  const at::ScalarType dtype = x.scalar_type();
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  switch (style) {
    case NormStyle::kScaleAfterCast:
      return weight * normed.to(dtype);
    case NormStyle::kOnePlusWeight:
      return (normed * (1.0 + weight.to(at::kFloat))).to(dtype);
    case NormStyle::kScaleInFp32:
      return (weight.to(at::kFloat) * normed).to(dtype);
  }
  HEADWISE_CHECK(false, "unknown norm style");
}

at::Tensor default_inv_freq(double base, int64_t dim, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor exponent = at::arange(0, dim, 2, opts).to(at::kFloat) / static_cast<double>(dim);
  return 1.0 / at::pow(base, exponent);
}

RotaryTable rotary_table(const at::Tensor& inv_freq, int64_t offset, int64_t steps,
                         double attention_factor, at::ScalarType dtype) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(inv_freq.device());
  const at::Tensor positions = at::arange(offset, offset + steps, opts).to(at::kFloat);
  // Same op order as HF: (inv_freq[:, None] @ positions[None, :]).T, then cat(freqs, freqs).
  const at::Tensor freqs =
      at::matmul(inv_freq.to(at::kFloat).view({-1, 1}), positions.view({1, -1})).transpose(0, 1);
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
  if (bias.defined() && bias.requires_grad())
    return at::linear(x, weight, bias);  // never in headwise
  const bool tracked = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad());
  if (!tracked) return pinned_linear(x, weight, bias);
  return PinnedLinear::apply(x, weight,
                             bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt);
}

at::Tensor pre_norm_residual(const at::Tensor& x, const at::Tensor& first_norm,
                             const at::Tensor& second_norm, double eps, NormStyle style,
                             const std::function<at::Tensor(const at::Tensor&)>& mixer,
                             const std::function<at::Tensor(const at::Tensor&)>& feed_forward) {
  const at::Tensor h = x + mixer(rms_norm(x, first_norm, eps, style));
  return h + feed_forward(rms_norm(h, second_norm, eps, style));
}

at::Tensor silu(const at::Tensor& x) {
  return at::silu(x);
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  return at::gelu(x, "tanh");
}

at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                     const at::Tensor& down, bool gelu) {
  const at::Tensor g = arch::linear(x, gate);
  return arch::linear((gelu ? arch::gelu_tanh(g) : arch::silu(g)) * arch::linear(x, up), down);
}

}  // namespace headwise::arch

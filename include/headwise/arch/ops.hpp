#pragma once
// Building blocks shared by architectures. Each follows the HF reference's numerics exactly
// (which dtype each step runs in), since parity with transformers is how we prove a forward.
#include <ATen/ATen.h>

#include <functional>

namespace headwise::arch {

enum class NormStyle {
  kScaleAfterCast,  // Llama: w * x̂.to(dtype)
  kOnePlusWeight,   // Gemma3 / Qwen3-Next: (x̂ * (1 + w.float())).to(dtype)
  kScaleInFp32,     // gpt-oss: (w * x̂).to(dtype), w kept in fp32
};

// x̂ = x_fp32 * rsqrt(mean(x_fp32^2) + eps) over the last dimension.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, NormStyle style);

// The pre-norm residual pair most decoder layers are: h = x + mixer(norm(x; first_norm)), then
// h + feed_forward(norm(h; second_norm)).
at::Tensor pre_norm_residual(const at::Tensor& x, const at::Tensor& first_norm,
                             const at::Tensor& second_norm, double eps, NormStyle style,
                             const std::function<at::Tensor(const at::Tensor&)>& mixer,
                             const std::function<at::Tensor(const at::Tensor&)>& feed_forward);

// Rotary embedding tables for positions [offset, offset + T): cos/sin of shape [T, rotary_dim]
// in the activation dtype (built in fp32, multiplied by attention_factor, then cast).
struct RotaryTable {
  at::Tensor cos;
  at::Tensor sin;
  int64_t rotary_dim = 0;
};

// inv_freq[j] = 1 / base^(2j / dim), fp32, as HF's default rope init computes it.
at::Tensor default_inv_freq(double base, int64_t dim, const at::Device& device);
RotaryTable rotary_table(const at::Tensor& inv_freq, int64_t offset, int64_t steps,
                         double attention_factor, at::ScalarType dtype);
// x: [B, heads, T, head_dim]; rotates the first table.rotary_dim dims (rotate_half layout),
// passes the rest through.
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTable& table);

// x @ w^T (+ b), the nn.Linear convention with HF weight layout [out, in].
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

at::Tensor silu(const at::Tensor& x);
at::Tensor gelu_tanh(const at::Tensor& x);
// down(act(gate x) * up x)
at::Tensor gated_mlp(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up,
                     const at::Tensor& down, bool gelu = false);

}  // namespace headwise::arch

#pragma once
// The Mamba-2 mixer (Bamba, Nemotron-H, Granite 4.0, Falcon-H1 share it), following
// transformers' torch fallbacks op for op: causal_conv1d_fn / _update with SiLU, the chunked SSD
// scan (mamba2_chunk_scan: intra-chunk "attention" through segment sums, inter-chunk state
// recurrence, all in fp32; O(T * chunk) per head, never T x T) and, for one-token steps that
// continue a state, the recurrent update (mamba2_selective_state_update); then the gated
// RMSNorm and out_proj.
#include <ATen/ATen.h>

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/state_shapes.hpp"

namespace headwise::arch {

struct Mamba2Weights {
  at::Tensor conv1d;     // [conv_dim, 1, K]
  at::Tensor conv_bias;  // [conv_dim] or undefined
  at::Tensor dt_bias;    // [heads]
  at::Tensor A_log;      // [heads]
  at::Tensor D;          // [heads]
  at::Tensor norm;       // [intermediate]
  at::Tensor out_proj;   // [hidden, intermediate]
  at::Tensor out_bias;   // [hidden] or undefined
};

struct Mamba2Options {
  int64_t chunk_size = 256;
  double dt_min = 0.0;  // time_step_limit
  double dt_max = std::numeric_limits<double>::infinity();
  double norm_eps = 1e-6;
  // The gated RMSNorm normalises groups of intermediate / norm_groups channels (1: all of them,
  // as Bamba's; n_groups for Nemotron-H's and Falcon-H1's).
  int64_t norm_groups = 1;
  // Where the SiLU(gate) goes: before the norm (most), after it (Falcon-H1's
  // mamba_norm_before_gate), or alone without a norm (Falcon-H1's mamba_rms_norm = false).
  enum class Gate { kThenNorm, kAfterNorm, kWithoutNorm } gate = Gate::kThenNorm;
};

// BambaMixer-style configs (Bamba, Granite 4.0-H): mamba_chunk_size (default 256) and
// time_step_limit (JSON has no infinity: transformers writes it as an object; a non-number
// bound means none), with the gated norm's eps.
Mamba2Options read_bamba_mixer_options(const ConfigReader& config, double norm_eps);

// `projected` = in_proj(x) [B, T, intermediate + conv_dim + heads] ([gate | xBC | dt]), in the
// activation dtype. `state` (nullable) holds "conv_state" [B, conv_dim, K] and "ssm_state"
// [B, heads, head_dim, state_size] (fp32), continued from and updated.
at::Tensor mamba2_mixer(const Mamba2Shape& shape, const Mamba2Options& options,
                        const at::Tensor& projected, const Mamba2Weights& weights,
                        LayerState* state);

// The mixer's weights under `module` (Bamba's "mamba.", Nemotron-H's "mixer."), read through
// `get(name)`; in_proj is the caller's (it also applies it).
// `out_bias`: whether out_proj has a bias; `norm`: whether the gated norm has a weight.
Mamba2Weights mamba2_weights(const std::function<const at::Tensor&(const std::string&)>& get,
                             const std::string& module, bool conv_bias, bool out_bias,
                             bool norm = true);
// Every weight the mixer reads (in_proj included): name under the module, and shape. `norm`: the
// gated norm's weight (absent without a norm); `out_bias`: out_proj's bias when it differs from
// in_proj's (Falcon-H1's projectors_bias).
std::vector<std::pair<std::string, std::vector<int64_t>>> mamba2_weight_shapes(
    const Mamba2Shape& shape, int64_t hidden, bool conv_bias, bool proj_bias, bool norm = true,
    std::optional<bool> out_bias = {});

}  // namespace headwise::arch

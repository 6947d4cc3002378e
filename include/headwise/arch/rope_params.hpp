#pragma once
// RoPE parameters as transformers reads them from config.json (v5 `rope_parameters`, legacy
// `rope_theta` + `rope_scaling`), and the inverse frequencies each rope type produces.
// Supported types: "default", "linear" (positions divided by `factor`, i.e. inv_freq / factor),
// "llama3" (per-band scaling) and "yarn" (NTK-by-parts interpolation between the original and the
// scaled frequencies, plus an attention factor on cos/sin: Qwen3's long-context configs, gpt-oss).
// Others (dynamic, longrope) fail with the field named.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "headwise/arch/model_spec.hpp"

namespace headwise::arch {

struct RopeParameters {
  std::string rope_type = "default";
  double theta = 10000.0;
  double factor = 1.0;                           // linear, llama3
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn
  // yarn (HF's _compute_yarn_parameters): the ramp between full interpolation (below beta_slow
  // rotations over the original context) and none (above beta_fast), and the cos/sin factor.
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;  // explicit, or from factor / mscale / mscale_all_dim
};

// The factor HF multiplies cos and sin by (yarn's attention factor; 1 for the other types).
double rope_attention_factor(const RopeParameters& params);

// Reads one rope-parameter object on top of `base` (whose theta is the fallback when the
// object has no `rope_theta`). `field` is the object's path in the config, for messages.
RopeParameters read_rope_object(const ConfigReader& reader, const nlohmann::json& object,
                                RopeParameters base, std::string_view field);

// One table for every layer (llama, qwen3). As HF's convert_rope_params_to_dict: a legacy
// `rope_scaling` replaces `rope_parameters`; theta comes from the object, else top-level
// `rope_theta`, else `default_theta`.
RopeParameters read_single_rope_parameters(const ConfigReader& reader, double default_theta);

// inv_freq (fp32, [head_dim / 2]) computed with HF's op order for the rope type.
at::Tensor rope_inv_freq(const RopeParameters& params, int64_t head_dim, const at::Device& device);

}  // namespace headwise::arch

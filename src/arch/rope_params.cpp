#include "headwise/arch/rope_params.hpp"

#include <cmath>
#include <numbers>

#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

double number_field(const ConfigReader& reader, const nlohmann::json& object, std::string_view field,
                    const char* key, double fallback) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number()) reader.fail(fmt::format("{}.{}", field, key), "must be a number");
  return it->get<double>();
}

}  // namespace

RopeParameters read_rope_object(const ConfigReader& reader, const nlohmann::json& object, RopeParameters base,
                                std::string_view field) {
  if (!object.is_object()) reader.fail(field, "must be an object");
  RopeParameters p = base;
  // Legacy configs spell the type `type`; `rope_type` wins when both are present.
  for (const char* key : {"type", "rope_type"}) {
    const auto it = object.find(key);
    if (it == object.end() || it->is_null()) continue;
    if (!it->is_string()) reader.fail(fmt::format("{}.{}", field, key), "must be a string");
    p.rope_type = it->get<std::string>();
  }
  p.theta = number_field(reader, object, field, "rope_theta", p.theta);
  if (number_field(reader, object, field, "partial_rotary_factor", 1.0) != 1.0) {
    throw_unsupported("{}: field '{}.partial_rotary_factor': partial rotary embeddings are not supported for {}",
                      reader.where(), field, reader.get_string("model_type", "this model"));
  }
  if (!(p.theta > 0)) reader.fail(fmt::format("{}.rope_theta", field), "must be positive");
  if (p.rope_type == "default") return p;
  if (p.rope_type != "linear" && p.rope_type != "llama3") {
    throw_unsupported("{}: field '{}.rope_type' is '{}'; supported: default, linear, llama3", reader.where(), field,
                      p.rope_type);
  }
  if (!object.contains("factor")) reader.fail(fmt::format("{}.factor", field), "is missing");
  p.factor = number_field(reader, object, field, "factor", 1.0);
  if (!(p.factor > 0)) reader.fail(fmt::format("{}.factor", field), "must be positive");
  if (p.rope_type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
      if (!object.contains(key)) reader.fail(fmt::format("{}.{}", field, key), "is missing");
    }
    p.low_freq_factor = number_field(reader, object, field, "low_freq_factor", 1.0);
    p.high_freq_factor = number_field(reader, object, field, "high_freq_factor", 4.0);
    if (!(p.high_freq_factor > p.low_freq_factor)) {
      reader.fail(fmt::format("{}.high_freq_factor", field), "must exceed low_freq_factor");
    }
    // HF fills a missing original context from max_position_embeddings (standardize_rope_params).
    const double original = number_field(reader, object, field, "original_max_position_embeddings",
                                         static_cast<double>(reader.get_positive_int("max_position_embeddings", 0)));
    if (!(original > 0)) reader.fail(fmt::format("{}.original_max_position_embeddings", field), "is missing");
    // The cast below is undefined beyond int64 (the class of bug fuzz_config_spec found in get_int).
    if (!(original < 9223372036854775808.0)) {
      reader.fail(fmt::format("{}.original_max_position_embeddings", field), "is out of range");
    }
    p.original_max_position_embeddings = static_cast<int64_t>(original);
  }
  return p;
}

RopeParameters read_single_rope_parameters(const ConfigReader& reader, double default_theta) {
  RopeParameters base;
  base.theta = reader.get_double("rope_theta", default_theta);
  if (reader.has("rope_scaling")) return read_rope_object(reader, reader.get("rope_scaling"), base, "rope_scaling");
  if (reader.has("rope_parameters")) {
    return read_rope_object(reader, reader.get("rope_parameters"), base, "rope_parameters");
  }
  return base;
}

at::Tensor rope_inv_freq(const RopeParameters& p, int64_t head_dim, const at::Device& device) {
  HEADWISE_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE needs an even head_dim, got {}", head_dim);
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor exponent = at::arange(0, head_dim, 2, long_opts).to(at::kFloat) / static_cast<double>(head_dim);
  at::Tensor inv_freq = at::pow(p.theta, exponent).reciprocal();  // HF: 1.0 / (base ** exponent)
  if (p.rope_type == "linear") return inv_freq / p.factor;
  if (p.rope_type != "llama3") return inv_freq;
  // modeling_rope_utils._compute_llama3_parameters, op for op in fp32.
  const double old_context = static_cast<double>(p.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / p.low_freq_factor;
  const double high_freq_wavelen = old_context / p.high_freq_factor;
  // Python's `scalar / tensor` is reciprocal() * scalar; mirrored for bit-equal tables.
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * std::numbers::pi);
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / p.factor, inv_freq);
  const at::Tensor smooth = (wavelen.reciprocal() * old_context - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / p.factor + smooth * scaled;
  const at::Tensor is_medium = (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
  return at::where(is_medium, smoothed, scaled);
}

}  // namespace headwise::arch

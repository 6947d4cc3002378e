#include "headwise/arch/rope_params.hpp"

#include <cmath>
#include <numbers>

#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

double number_field(const ConfigReader& reader, const nlohmann::json& object,
                    std::string_view field, const char* key, double fallback) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_number()) reader.fail(fmt::format("{}.{}", field, key), "must be a number");
  return it->get<double>();
}

// HF's get_mscale: 0.1 * mscale * ln(scale) + 1 above scale 1.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The context the model was pretrained at: the object's, else the config's top-level one (Phi3
// keeps it there), else max_position_embeddings, as HF's standardize_rope_params fills it.
int64_t original_context(const ConfigReader& reader, const nlohmann::json& object,
                         std::string_view field) {
  const double top = static_cast<double>(reader.get_positive_int(
      "original_max_position_embeddings", reader.get_positive_int("max_position_embeddings", 0)));
  const double original =
      number_field(reader, object, field, "original_max_position_embeddings", top);
  if (!(original > 0))
    reader.fail(fmt::format("{}.original_max_position_embeddings", field), "is missing");
  // The cast below is undefined beyond int64 (the class of bug fuzz_config_spec found in get_int).
  if (!(original < 9223372036854775808.0)) {
    reader.fail(fmt::format("{}.original_max_position_embeddings", field), "is out of range");
  }
  return static_cast<int64_t>(original);
}

void read_yarn_fields(const ConfigReader& reader, const nlohmann::json& object,
                      std::string_view field, RopeParameters& p) {
  p.original_max_position_embeddings = original_context(reader, object, field);
  // HF reads these with `or`: a 0 or null falls back to the default too.
  p.beta_fast = number_field(reader, object, field, "beta_fast", 0.0);
  p.beta_slow = number_field(reader, object, field, "beta_slow", 0.0);
  if (p.beta_fast == 0) p.beta_fast = 32.0;
  if (p.beta_slow == 0) p.beta_slow = 1.0;
  if (!(p.beta_fast > 0) || !(p.beta_slow > 0))
    reader.fail(fmt::format("{}.beta_fast", field), "must be positive");
  if (const auto it = object.find("truncate"); it != object.end() && !it->is_null()) {
    if (!it->is_boolean()) reader.fail(fmt::format("{}.truncate", field), "must be true or false");
    p.truncate = it->get<bool>();
  }
  const double mscale = number_field(reader, object, field, "mscale", 0.0);
  const double mscale_all_dim = number_field(reader, object, field, "mscale_all_dim", 0.0);
  p.attention_factor = number_field(reader, object, field, "attention_factor", 0.0);
  if (p.attention_factor == 0.0) {
    p.attention_factor = mscale != 0 && mscale_all_dim != 0
                             ? yarn_mscale(p.factor, mscale) / yarn_mscale(p.factor, mscale_all_dim)
                             : yarn_mscale(p.factor, 1.0);
  }
  if (!(p.attention_factor > 0) || !std::isfinite(p.attention_factor)) {
    reader.fail(fmt::format("{}.attention_factor", field), "must be positive");
  }
}

// HF's find_correction_dim: the dimension index whose frequency turns `rotations` times over the
// original context.
double correction_dim(double rotations, int64_t dim, double base, double context) {
  return (static_cast<double>(dim) * std::log(context / (rotations * 2 * std::numbers::pi))) /
         (2 * std::log(base));
}

}  // namespace

double rope_attention_factor(const RopeParameters& params) {
  return params.rope_type == "yarn" ? params.attention_factor : 1.0;
}

RopeParameters read_rope_object(const ConfigReader& reader, const nlohmann::json& object,
                                RopeParameters base, std::string_view field) {
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
    throw_unsupported(
        "{}: field '{}.partial_rotary_factor': partial rotary embeddings are not supported for {}",
        reader.where(), field, reader.get_string("model_type", "this model"));
  }
  if (!(p.theta > 0)) reader.fail(fmt::format("{}.rope_theta", field), "must be positive");
  if (p.rope_type == "default") return p;
  if (p.rope_type != "linear" && p.rope_type != "llama3" && p.rope_type != "yarn") {
    throw_unsupported("{}: field '{}.rope_type' is '{}'; supported: default, linear, llama3, yarn",
                      reader.where(), field, p.rope_type);
  }
  if (!object.contains("factor")) reader.fail(fmt::format("{}.factor", field), "is missing");
  p.factor = number_field(reader, object, field, "factor", 1.0);
  if (!(p.factor > 0)) reader.fail(fmt::format("{}.factor", field), "must be positive");
  if (p.rope_type == "yarn") read_yarn_fields(reader, object, field, p);
  if (p.rope_type == "llama3") {
    for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
      if (!object.contains(key)) reader.fail(fmt::format("{}.{}", field, key), "is missing");
    }
    p.low_freq_factor = number_field(reader, object, field, "low_freq_factor", 1.0);
    p.high_freq_factor = number_field(reader, object, field, "high_freq_factor", 4.0);
    if (!(p.high_freq_factor > p.low_freq_factor)) {
      reader.fail(fmt::format("{}.high_freq_factor", field), "must exceed low_freq_factor");
    }
    p.original_max_position_embeddings = original_context(reader, object, field);
  }
  return p;
}

RopeParameters read_single_rope_parameters(const ConfigReader& reader, double default_theta) {
  RopeParameters base;
  base.theta = reader.get_double("rope_theta", default_theta);
  if (reader.has("rope_scaling"))
    return read_rope_object(reader, reader.get("rope_scaling"), base, "rope_scaling");
  if (reader.has("rope_parameters")) {
    return read_rope_object(reader, reader.get("rope_parameters"), base, "rope_parameters");
  }
  return base;
}

// modeling_rope_utils._compute_yarn_parameters, op for op in fp32: each frequency is blended
// between itself (extrapolation, for the fast-turning dimensions) and itself / factor
// (interpolation, for the slow ones) along a linear ramp over the dimension index.
at::Tensor yarn_inv_freq(const RopeParameters& p, int64_t dim, const at::Device& device) {
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor pos_freqs =
      at::pow(p.theta, at::arange(0, dim, 2, long_opts).to(at::kFloat) / static_cast<double>(dim));
  const at::Tensor extrapolation = pos_freqs.reciprocal();
  const at::Tensor interpolation = (pos_freqs * p.factor).reciprocal();
  const auto context = static_cast<double>(p.original_max_position_embeddings);
  double low = correction_dim(p.beta_fast, dim, p.theta, context);
  double high = correction_dim(p.beta_slow, dim, p.theta, context);
  if (p.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // HF: prevents a division by zero
  const at::Tensor ramp =
      ((at::arange(dim / 2, at::TensorOptions().dtype(at::kFloat)) - low) / (high - low))
          .clamp(0, 1)
          .to(device);
  const at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

at::Tensor rope_inv_freq(const RopeParameters& p, int64_t head_dim, const at::Device& device) {
  HEADWISE_CHECK(head_dim > 0 && head_dim % 2 == 0, "RoPE needs an even head_dim, got {}",
                 head_dim);
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor exponent =
      at::arange(0, head_dim, 2, long_opts).to(at::kFloat) / static_cast<double>(head_dim);
  at::Tensor inv_freq = at::pow(p.theta, exponent).reciprocal();  // HF: 1.0 / (base ** exponent)
  if (p.rope_type == "linear") return inv_freq / p.factor;
  if (p.rope_type == "yarn") return yarn_inv_freq(p, head_dim, device);
  if (p.rope_type != "llama3") return inv_freq;
  // modeling_rope_utils._compute_llama3_parameters, op for op in fp32.
  const double old_context = static_cast<double>(p.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / p.low_freq_factor;
  const double high_freq_wavelen = old_context / p.high_freq_factor;
  // Python's `scalar / tensor` is reciprocal() * scalar; mirrored for bit-equal tables.
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * std::numbers::pi);
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / p.factor, inv_freq);
  const at::Tensor smooth = (wavelen.reciprocal() * old_context - p.low_freq_factor) /
                            (p.high_freq_factor - p.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / p.factor + smooth * scaled;
  const at::Tensor is_medium =
      (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
  return at::where(is_medium, smoothed, scaled);
}

}  // namespace headwise::arch

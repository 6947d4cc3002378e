#include "headwise/arch/model_spec.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

constexpr std::array<std::pair<LayerKind, std::string_view>, 6> kKindNames{{
    {LayerKind::kFullAttention, "full_attention"},
    {LayerKind::kSlidingAttention, "sliding_attention"},
    {LayerKind::kLinearAttention, "linear_attention"},
    {LayerKind::kMamba, "mamba"},
    {LayerKind::kShortConv, "conv"},
    {LayerKind::kMlpOnly, "mlp"},
}};

}  // namespace

std::string_view layer_kind_name(LayerKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  HEADWISE_CHECK(false, "unknown layer kind {}", static_cast<int>(kind));
}

LayerKind parse_layer_kind(std::string_view name, std::string_view what) {
  for (const auto& [k, n] : kKindNames) {
    if (n == name) return k;
  }
  throw_input_error("{}: unknown layer kind '{}'", what, name);
}

std::string_view state_class_name(StateClass c) {
  switch (c) {
    case StateClass::kLinearState:
      return "linear_state";
    case StateClass::kSsmState:
      return "ssm_state";
    case StateClass::kOtherState:
      return "other_state";
  }
  HEADWISE_CHECK(false, "unknown state class");
}

int64_t StateTensorSpec::bytes_per_sequence() const {
  int64_t n = element_size(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> ModelSpec::global_layer_ids() const {
  std::vector<int64_t> ids;
  for (const auto& layer : layers) {
    if (layer.is_global()) ids.push_back(layer.id);
  }
  return ids;
}

const LayerSpec& ModelSpec::layer(int64_t id) const {
  HEADWISE_CHECK(id >= 0 && id < num_layers(), "layer {} out of range [0, {})", id, num_layers());
  return layers[static_cast<size_t>(id)];
}

// ---- ConfigReader ----

bool ConfigReader::has(std::string_view key) const {
  const auto it = config_.find(key);
  return it != config_.end() && !it->is_null();
}

void ConfigReader::fail(std::string_view key, std::string_view message) const {
  throw_input_error("{}: field '{}' {}", where_, key, message);
}

const nlohmann::json& ConfigReader::get(std::string_view key) const {
  const auto it = config_.find(key);
  if (it == config_.end() || it->is_null()) fail(key, "is missing");
  return *it;
}

int64_t ConfigReader::get_int(std::string_view key) const {
  const auto& value = get(key);
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail(key, "is out of range");
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    // Range first: casting a double outside int64 is undefined behaviour (fuzz_config_spec
    // found 6.5e124 as hidden_size). 2^63 is exactly representable; every double below it fits.
    const double d = value.get<double>();
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) fail(key, "is out of range");
    if (d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  fail(key, "must be an integer");
}

int64_t ConfigReader::get_int(std::string_view key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double ConfigReader::get_double(std::string_view key) const {
  const auto& value = get(key);
  if (!value.is_number()) fail(key, "must be a number");
  return value.get<double>();
}

double ConfigReader::get_double(std::string_view key, double fallback) const {
  return has(key) ? get_double(key) : fallback;
}

bool ConfigReader::get_bool(std::string_view key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& value = get(key);
  if (!value.is_boolean()) fail(key, "must be true or false");
  return value.get<bool>();
}

std::string ConfigReader::get_string(std::string_view key) const {
  const auto& value = get(key);
  if (!value.is_string()) fail(key, "must be a string");
  return value.get<std::string>();
}

std::string ConfigReader::get_string(std::string_view key, std::string_view fallback) const {
  return has(key) ? get_string(key) : std::string(fallback);
}

std::vector<std::string> ConfigReader::get_string_list(std::string_view key) const {
  const auto& value = get(key);
  if (!value.is_array()) fail(key, "must be a list of strings");
  std::vector<std::string> out;
  for (const auto& item : value) {
    if (!item.is_string()) fail(key, "must be a list of strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::vector<int64_t> ConfigReader::get_int_list(std::string_view key) const {
  const auto& value = get(key);
  if (!value.is_array()) fail(key, "must be a list of integers");
  std::vector<int64_t> out;
  for (const auto& item : value) {
    if (!item.is_number_integer()) fail(key, "must be a list of integers");
    if (item.is_number_unsigned() && item.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(key, "is out of range");
    out.push_back(item.get<int64_t>());
  }
  return out;
}

namespace {

// Counts that size per-layer and per-head containers: a config with 31,111,111,111 layers
// (found by fuzzing) would otherwise ask for a terabyte of layer entries before any other
// check. The limits are far above any model (the largest have ~200 layers and 128 heads).
std::optional<int64_t> count_limit(std::string_view key) {
  static constexpr std::pair<std::string_view, int64_t> kLimits[] = {
      {"num_hidden_layers", 16384},      {"num_attention_heads", 65536},
      {"num_key_value_heads", 65536},    {"linear_num_key_heads", 65536},
      {"linear_num_value_heads", 65536}, {"mamba_n_heads", 65536},
      {"num_local_experts", 1 << 20},    {"num_experts", 1 << 20}};
  for (const auto& [name, limit] : kLimits) {
    if (key == name) return limit;
  }
  return std::nullopt;
}

}  // namespace

int64_t ConfigReader::get_positive_int(std::string_view key) const {
  const int64_t value = get_int(key);
  if (value <= 0) fail(key, fmt::format("must be positive, got {}", value));
  if (const auto limit = count_limit(key); limit && value > *limit) {
    fail(key, fmt::format("is {}, more than any model has (at most {})", value, *limit));
  }
  return value;
}

int64_t ConfigReader::get_positive_int(std::string_view key, int64_t fallback) const {
  return has(key) ? get_positive_int(key) : fallback;
}

}  // namespace headwise::arch

#include "headwise/arch/context_guard.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "headwise/core/error.hpp"

namespace headwise::arch {
namespace {

// "linear x8", "yarn x4 (from 32768)" for one rope-parameter object; empty for the default type.
std::string describe_rope_object(const nlohmann::json& object) {
  if (!object.is_object()) return "";
  const std::string type = object.value("rope_type", object.value("type", std::string("default")));
  if (type == "default") return "";
  std::string out = type;
  if (object.contains("factor") && object["factor"].is_number())
    out += fmt::format(" x{:g}", object["factor"].get<double>());
  if (object.contains("original_max_position_embeddings") &&
      object["original_max_position_embeddings"].is_number_integer()) {
    out += fmt::format(" (from {})", object["original_max_position_embeddings"].get<int64_t>());
  }
  return out;
}

std::string describe_rope(const nlohmann::json& text) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const auto it = text.find(key);
    if (it == text.end() || !it->is_object()) continue;
    if (it->contains("rope_type") || it->contains("type")) {
      const std::string one = describe_rope_object(*it);
      return one.empty() ? "default" : one;
    }
    // Per layer type (Gemma-3: full_attention / sliding_attention).
    std::vector<std::string> parts;
    for (const auto& [layer_type, object] : it->items()) {
      const std::string one = describe_rope_object(object);
      if (!one.empty()) parts.push_back(fmt::format("{} on {} layers", one, layer_type));
    }
    return parts.empty() ? "default" : fmt::format("{}", fmt::join(parts, ", "));
  }
  return "default";
}

}  // namespace

ContextLimit context_limit(const ModelSpec& spec) {
  ContextLimit limit;
  const auto it = spec.text_config.find("max_position_embeddings");
  if (it != spec.text_config.end() && it->is_number_integer() && it->get<int64_t>() > 0) {
    limit.max_position_embeddings = it->get<int64_t>();
  }
  limit.rope = describe_rope(spec.text_config);
  return limit;
}

std::optional<std::string> check_context(const ModelSpec& spec, int64_t context,
                                         std::string_view flag, std::string_view where) {
  if (context <= 0) throw_input_error("{} must be positive, got {}", flag, context);
  if (context > kMaxRepresentablePosition) {
    throw_input_error(
        "{} {} is beyond {} tokens: rotary angles are computed from fp32 positions, which stop "
        "being "
        "exact integers there, so positions that far cannot be represented",
        flag, context, kMaxRepresentablePosition);
  }
  const ContextLimit limit = context_limit(spec);
  if (limit.max_position_embeddings == 0 || context <= limit.max_position_embeddings)
    return std::nullopt;
  return fmt::format(
      "{} {} exceeds {} max_position_embeddings {} (RoPE: {}): positions beyond it were never "
      "trained; serve at most that, or use a config whose max_position_embeddings (and RoPE "
      "scaling) cover the context",
      flag, context, where, limit.max_position_embeddings, limit.rope);
}

}  // namespace headwise::arch

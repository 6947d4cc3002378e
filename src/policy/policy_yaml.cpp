// policy.yaml text <-> Policy. The writer fixes key order and number formatting so the same
// Policy always gives the same bytes; the reader rejects anything it does not know.
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "headwise/core/error.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::policy {
namespace {

// ---------------------------------------------------------------- writing

// Shortest round-trip decimal; integral values print without a fraction.
std::string format_double(double x) {
  return fmt::format("{}", x);
}

void emit_json(YAML::Emitter& out, const nlohmann::json& value) {
  if (value.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, item] : value.items()) {  // nlohmann objects iterate in key order
      out << YAML::Key << key << YAML::Value;
      emit_json(out, item);
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& item : value) emit_json(out, item);
    out << YAML::EndSeq;
  } else if (value.is_string()) {
    out << YAML::DoubleQuoted << value.get<std::string>();  // quoted: "123" stays a string
  } else if (value.is_boolean()) {
    out << (value.get<bool>() ? "true" : "false");
  } else if (value.is_number_integer()) {
    out << value.dump();
  } else if (value.is_number_float()) {
    out << format_double(value.get<double>());
  } else {
    out << YAML::Null;
  }
}

void emit_windows(YAML::Emitter& out, const std::vector<int64_t>& windows) {
  out << YAML::Flow << YAML::BeginSeq;
  for (int64_t w : windows) out << window_name(w);
  out << YAML::EndSeq;
}

void emit_memory(YAML::Emitter& out, const PolicyMemory& m) {
  out << YAML::BeginMap;
  out << YAML::Key << "total_bytes" << YAML::Value << m.total_bytes;
  out << YAML::Key << "global_kv_bytes" << YAML::Value << m.components.global_kv_bytes;
  out << YAML::Key << "local_kv_bytes" << YAML::Value << m.components.local_kv_bytes;
  out << YAML::Key << "linear_state_bytes" << YAML::Value << m.components.linear_state_bytes;
  out << YAML::Key << "ssm_state_bytes" << YAML::Value << m.components.ssm_state_bytes;
  out << YAML::Key << "other_state_bytes" << YAML::Value << m.components.other_state_bytes;
  // Only policies whose heads select tokens have it: window-only policies keep their bytes.
  if (m.components.selection_state_bytes > 0) {
    out << YAML::Key << "selection_state_bytes" << YAML::Value
        << m.components.selection_state_bytes;
  }
  out << YAML::Key << "full_kv_total_bytes" << YAML::Value << m.full_kv_total_bytes;
  out << YAML::EndMap;
}

void emit_layers(YAML::Emitter& out, const Policy& p) {
  out << YAML::Key << "non_global_layers" << YAML::Value << YAML::BeginSeq;
  for (const auto& l : p.non_global_layers) {
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "layer_id" << YAML::Value << l.layer_id
        << YAML::Key << "kind" << YAML::Value << l.kind << YAML::Key << "bytes" << YAML::Value
        << l.bytes << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "per_layer_policies" << YAML::Value << YAML::BeginSeq;
  for (const auto& l : p.per_layer_policies) {
    out << YAML::BeginMap << YAML::Key << "layer_id" << YAML::Value << l.layer_id;
    out << YAML::Key << "kv_head_windows" << YAML::Value;
    emit_windows(out, l.kv_head_windows);
    if (!l.expected_distortion.empty()) {
      out << YAML::Key << "expected_distortion" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (double d : l.expected_distortion) out << format_double(d);
      out << YAML::EndSeq;
    }
    // Written only when some head selects tokens: window-only policies keep their bytes.
    if (l.selects_tokens()) {
      out << YAML::Key << "kv_head_rules" << YAML::Value << YAML::Flow << YAML::BeginSeq;
      for (KeepRule rule : l.kv_head_rules) out << keep_rule_name(rule);
      out << YAML::EndSeq;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

}  // namespace

std::string to_yaml(const Policy& p) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "schema" << YAML::Value << std::string(kSchema);
  out << YAML::Key << "model_name" << YAML::Value << YAML::DoubleQuoted << p.model_name;
  out << YAML::Key << "model_path" << YAML::Value << YAML::DoubleQuoted << p.model_path;
  out << YAML::Key << "model_fingerprint" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "config_sha256" << YAML::Value << p.fingerprint.config_sha256;
  out << YAML::Key << "weights_headers_sha256" << YAML::Value;
  if (p.fingerprint.weights_headers_sha256)
    out << *p.fingerprint.weights_headers_sha256;
  else
    out << YAML::Null;
  out << YAML::EndMap;
  out << YAML::Key << "budget_gb" << YAML::Value << format_double(p.budget_gb);
  out << YAML::Key << "context" << YAML::Value << p.context;
  out << YAML::Key << "batch" << YAML::Value << p.batch;
  out << YAML::Key << "dtype" << YAML::Value << std::string(dtype_name(p.dtype));
  // Omitted for native states, so policies written before the field stay byte-identical.
  if (p.state_dtype)
    out << YAML::Key << "state_dtype" << YAML::Value << std::string(dtype_name(*p.state_dtype));
  out << YAML::Key << "block_size" << YAML::Value << p.block_size;
  out << YAML::Key << "sink_tokens" << YAML::Value << p.sink_tokens;
  out << YAML::Key << "window_levels" << YAML::Value;
  emit_windows(out, p.window_levels);
  out << YAML::Key << "calibration" << YAML::Value;
  emit_json(out, p.calibration.is_null() ? nlohmann::json::object() : p.calibration);
  out << YAML::Key << "memory" << YAML::Value;
  emit_memory(out, p.memory);
  if (p.engine) {  // only when calibrated for another engine: other policies stay byte-identical
    out << YAML::Key << "engine" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "name" << YAML::Value << p.engine->name;
    out << YAML::Key << "rules_version" << YAML::Value << YAML::DoubleQuoted
        << p.engine->rules_version;
    out << YAML::Key << "max_num_batched_tokens" << YAML::Value << p.engine->max_num_batched_tokens;
    out << YAML::Key << "mamba_cache_mode" << YAML::Value << p.engine->mamba_cache_mode;
    out << YAML::Key << "attention_block_size" << YAML::Value << p.engine->attention_block_size;
    out << YAML::Key << "total_bytes" << YAML::Value << p.engine->total_bytes;
    out << YAML::Key << "full_kv_total_bytes" << YAML::Value << p.engine->full_kv_total_bytes;
    out << YAML::EndMap;
  }
  if (p.tensor_parallel_size)  // only when calibrated for tensor parallelism
    out << YAML::Key << "tensor_parallel_size" << YAML::Value << *p.tensor_parallel_size;
  emit_layers(out, p);
  out << YAML::EndMap;
  HEADWISE_CHECK(out.good(), "YAML emitter: {}", out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace headwise::policy

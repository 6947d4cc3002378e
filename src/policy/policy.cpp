#include "headwise/policy/policy.hpp"

#include <algorithm>
#include <set>

#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::policy {

std::string window_name(int64_t window) {
  return window_label(window);
}

memory::MemoryOptions Policy::memory_options() const {
  memory::MemoryOptions o;
  o.context = context;
  o.batch = batch;
  o.kv_dtype = dtype;
  o.state_dtype = state_dtype;
  o.block_size = block_size;
  o.sink_tokens = sink_tokens;
  return o;
}

memory::HeadWindows Policy::head_windows() const {
  memory::HeadWindows out;
  for (const auto& layer : per_layer_policies) out[layer.layer_id] = layer.kv_head_windows;
  return out;
}

bool LayerPolicy::selects_tokens() const {
  return std::any_of(kv_head_rules.begin(), kv_head_rules.end(),
                     [](const KeepRule& rule) { return rule.selects_tokens(); });
}

KeepRule LayerPolicy::rule(size_t head) const {
  return kv_head_rules.empty() ? KeepRule::kWindow : kv_head_rules.at(head);
}

std::set<int64_t> Policy::selecting_layers() const {
  std::set<int64_t> out;
  for (const auto& layer : per_layer_policies) {
    if (layer.selects_tokens()) out.insert(layer.layer_id);
  }
  return out;
}

std::set<std::pair<int64_t, int64_t>> Policy::window_heads_of_selecting_layers() const {
  std::set<std::pair<int64_t, int64_t>> out;
  for (const auto& layer : per_layer_policies) {
    if (!layer.selects_tokens()) continue;
    for (size_t h = 0; h < layer.kv_head_windows.size(); ++h) {
      if (layer.rule(h) == KeepRule::kWindow) out.insert({layer.layer_id, static_cast<int64_t>(h)});
    }
  }
  return out;
}

std::set<std::pair<int64_t, int64_t>> Policy::heads_with_rule(const KeepRule& rule) const {
  std::set<std::pair<int64_t, int64_t>> out;
  for (const auto& layer : per_layer_policies) {
    for (size_t h = 0; h < layer.kv_head_windows.size(); ++h) {
      if (layer.rule(h) == rule) out.insert({layer.layer_id, static_cast<int64_t>(h)});
    }
  }
  return out;
}

namespace {
std::vector<std::string>& registered_rule_names() {
  static std::vector<std::string> names = {KeepRule::kWindow.name(), KeepRule::kH2O.name()};
  return names;
}
}  // namespace

const std::vector<std::string>& keep_rule_names() {
  return registered_rule_names();
}

void register_keep_rule_name(std::string_view name) {
  auto& names = registered_rule_names();
  HEADWISE_CHECK(!name.empty() && std::find(names.begin(), names.end(), name) == names.end(),
                 "keep rule '{}' registered twice (or unnamed)", name);
  names.emplace_back(name);
}

KeepRule KeepRule::from_name(std::string_view name, std::string_view key) {
  const auto& names = keep_rule_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw_input_error("{}: '{}' is not a keep rule ({})", key, name, fmt::join(names, ", "));
  }
  return KeepRule(std::string(name));
}

std::string keep_rule_name(const KeepRule& rule) {
  return rule.name();
}

KeepRule keep_rule_from_name(std::string_view name, std::string_view key) {
  return KeepRule::from_name(name, key);
}

DType parse_state_dtype(std::string_view text, std::string_view what) {
  const DType d = parse_dtype(text, what);
  if (d != DType::kFloat32 && d != DType::kBFloat16 && d != DType::kFloat16) {
    throw_input_error("{}: '{}' is not a state dtype (float32, bfloat16, float16)", what, text);
  }
  return d;
}

ModelFingerprint fingerprint_model(const std::filesystem::path& model_dir) {
  ModelFingerprint f;
  f.config_sha256 = sha256_file_hex(model_dir / "config.json");
  const auto checkpoint = io::Checkpoint::open(model_dir, /*allow_missing_weights=*/true);
  if (checkpoint->has_weights()) f.weights_headers_sha256 = checkpoint->headers_sha256();
  return f;
}

void fill_memory(Policy& policy, const arch::ModelSpec& spec) {
  const memory::MemoryOptions options = policy.memory_options();
  const memory::MemoryEstimate e =
      memory::estimate(spec, policy.head_windows(), options, policy.selecting_layers());
  policy.memory.components = e.components;
  policy.memory.total_bytes = e.total_bytes;
  policy.memory.full_kv_total_bytes = memory::full_kv_bytes(spec, options);
  policy.non_global_layers.clear();
  for (const auto& layer : e.layers) {
    if (layer.kv_head_windows) continue;
    policy.non_global_layers.push_back(
        {layer.layer_id, std::string(arch::layer_kind_name(layer.kind)), layer.bytes});
  }
}

namespace {

void check_layers_against_model(const Policy& policy, const arch::ModelSpec& spec,
                                std::string_view where) {
  std::set<int64_t> seen;
  for (const auto& layer : policy.per_layer_policies) {
    const int64_t id = layer.layer_id;
    if (id < 0 || id >= spec.num_layers() || !spec.layer(id).is_global()) {
      throw_input_error(
          "{}: per_layer_policies: layer_id {} is not a global attention layer of the model "
          "(global "
          "layers: {})",
          where, id, fmt::join(spec.global_layer_ids(), ", "));
    }
    if (!seen.insert(id).second)
      throw_input_error("{}: per_layer_policies: layer_id {} appears twice", where, id);
    const int64_t heads = spec.layer(id).attention->num_kv_heads;
    if (static_cast<int64_t>(layer.kv_head_windows.size()) != heads) {
      throw_input_error(
          "{}: per_layer_policies: layer_id {}: kv_head_windows has {} entries, the model has {} "
          "KV heads",
          where, id, layer.kv_head_windows.size(), heads);
    }
    if (!layer.kv_head_rules.empty() && static_cast<int64_t>(layer.kv_head_rules.size()) != heads) {
      throw_input_error(
          "{}: per_layer_policies: layer_id {}: kv_head_rules has {} entries, the model has {} KV "
          "heads",
          where, id, layer.kv_head_rules.size(), heads);
    }
  }
  for (int64_t id : spec.global_layer_ids()) {
    if (!seen.contains(id))
      throw_input_error("{}: per_layer_policies: global layer {} is missing", where, id);
  }
}

void check_memory_block(const Policy& policy, const arch::ModelSpec& spec, std::string_view where) {
  Policy expected = policy;
  fill_memory(expected, spec);
  const auto& a = policy.memory;
  const auto& b = expected.memory;
  const auto mismatch = [&](std::string_view key, int64_t got, int64_t want) {
    if (got != want) {
      throw_input_error(
          "{}: memory.{} is {} but the model and policy need {} (stale file? regenerate it)", where,
          key, got, want);
    }
  };
  mismatch("total_bytes", a.total_bytes, b.total_bytes);
  mismatch("global_kv_bytes", a.components.global_kv_bytes, b.components.global_kv_bytes);
  mismatch("local_kv_bytes", a.components.local_kv_bytes, b.components.local_kv_bytes);
  mismatch("linear_state_bytes", a.components.linear_state_bytes, b.components.linear_state_bytes);
  mismatch("ssm_state_bytes", a.components.ssm_state_bytes, b.components.ssm_state_bytes);
  mismatch("other_state_bytes", a.components.other_state_bytes, b.components.other_state_bytes);
  mismatch("selection_state_bytes", a.components.selection_state_bytes,
           b.components.selection_state_bytes);
  mismatch("full_kv_total_bytes", a.full_kv_total_bytes, b.full_kv_total_bytes);
  if (policy.non_global_layers.size() != expected.non_global_layers.size()) {
    throw_input_error("{}: non_global_layers lists {} layers, the model has {}", where,
                      policy.non_global_layers.size(), expected.non_global_layers.size());
  }
  for (size_t i = 0; i < expected.non_global_layers.size(); ++i) {
    const auto& got = policy.non_global_layers[i];
    const auto& want = expected.non_global_layers[i];
    if (got.layer_id != want.layer_id || got.kind != want.kind || got.bytes != want.bytes) {
      throw_input_error(
          "{}: non_global_layers[{}]: layer {} ({}, {} bytes) but the model has layer {} ({}, {} "
          "bytes)",
          where, i, got.layer_id, got.kind, got.bytes, want.layer_id, want.kind, want.bytes);
    }
  }
}

}  // namespace

void validate_against_model(const Policy& policy, const arch::ModelSpec& spec,
                            std::string_view where) {
  check_layers_against_model(policy, spec, where);
  // A policy read without a memory block (hand-written serving files) has nothing to compare.
  if (policy.memory.total_bytes != 0 || !policy.non_global_layers.empty())
    check_memory_block(policy, spec, where);
}

void write_policy(const std::filesystem::path& path, const Policy& policy) {
  write_file_atomically(path, to_yaml(policy));
}

Policy read_policy(const std::filesystem::path& path) {
  return from_yaml(read_text_file(path), path.string());
}

}  // namespace headwise::policy

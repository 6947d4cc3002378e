// Strict policy.yaml reader: every key is known, every value typed and range-checked, every
// error names the file and the key path (and the layer) at fault.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "headwise/core/error.hpp"
#include "headwise/memory/tensor_parallel.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::policy {
namespace {

class Reader {
 public:
  explicit Reader(std::string_view where) : where_(where) {}

  [[noreturn]] void fail(const YAML::Node& node, std::string_view key,
                         std::string_view message) const {
    const YAML::Mark mark = node.Mark();
    if (mark.is_null()) throw_input_error("{}: {}: {}", where_, key, message);
    throw_input_error("{}:{}:{}: {}: {}", where_, mark.line + 1, mark.column + 1, key, message);
  }

  void check_keys(const YAML::Node& map, std::string_view context,
                  const std::set<std::string>& allowed,
                  const std::set<std::string>& required) const {
    if (!map.IsMap()) fail(map, context, "must be a mapping");
    for (const auto& item : map) {
      const std::string key = item.first.as<std::string>();
      if (!allowed.contains(key)) {
        fail(item.first, context.empty() ? key : fmt::format("{}.{}", context, key),
             fmt::format("unknown key (allowed: {})", fmt::join(allowed, ", ")));
      }
    }
    for (const auto& key : required) {
      if (!map[key])
        fail(map, context.empty() ? key : fmt::format("{}.{}", context, key), "is missing");
    }
  }

  std::string scalar(const YAML::Node& node, std::string_view key) const {
    if (!node || !node.IsScalar()) fail(node, key, "must be a single value");
    return node.Scalar();
  }

  int64_t integer(const YAML::Node& node, std::string_view key) const {
    const std::string s = scalar(node, key);
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size())
      fail(node, key, fmt::format("'{}' is not an integer", s));
    return value;
  }

  int64_t positive(const YAML::Node& node, std::string_view key) const {
    const int64_t v = integer(node, key);
    if (v <= 0) fail(node, key, fmt::format("must be positive, got {}", v));
    return v;
  }

  int64_t non_negative(const YAML::Node& node, std::string_view key) const {
    const int64_t v = integer(node, key);
    if (v < 0) fail(node, key, fmt::format("must not be negative, got {}", v));
    return v;
  }

  double number(const YAML::Node& node, std::string_view key) const {
    const std::string s = scalar(node, key);
    double value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value)) {
      fail(node, key, fmt::format("'{}' is not a finite number", s));
    }
    return value;
  }

  // A window: `full` or a positive integer.
  int64_t window(const YAML::Node& node, std::string_view key) const {
    if (node.IsScalar() && node.Scalar() == "full") return kFull;
    return positive(node, key);
  }

  nlohmann::json to_json(const YAML::Node& node, std::string_view key) const {
    if (node.IsMap()) {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& item : node) {
        const std::string k = item.first.as<std::string>();
        out[k] = to_json(item.second, fmt::format("{}.{}", key, k));
      }
      return out;
    }
    if (node.IsSequence()) {
      nlohmann::json out = nlohmann::json::array();
      for (size_t i = 0; i < node.size(); ++i)
        out.push_back(to_json(node[i], fmt::format("{}[{}]", key, i)));
      return out;
    }
    if (node.IsNull()) return nullptr;
    const std::string& s = node.Scalar();
    if (node.Tag() == "!") return s;  // quoted: a string whatever it looks like
    if (s == "true" || s == "false") return s == "true";
    int64_t i = 0;
    if (auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
        ec == std::errc() && end == s.data() + s.size()) {
      return i;
    }
    double d = 0;
    if (auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
        ec == std::errc() && end == s.data() + s.size()) {
      return d;
    }
    return s;
  }

  std::string_view where() const { return where_; }

 private:
  std::string where_;
};

std::vector<int64_t> read_ladder(const Reader& r, const YAML::Node& node) {
  if (!node.IsSequence() || node.size() == 0)
    r.fail(node, "window_levels", "must be a non-empty list");
  std::vector<int64_t> levels;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string key = fmt::format("window_levels[{}]", i);
    const int64_t w = r.window(node[i], key);
    if (!levels.empty() && (levels.back() == kFull || (w != kFull && w <= levels.back()))) {
      r.fail(node[i], key, "levels must be strictly ascending with `full` last");
    }
    levels.push_back(w);
  }
  return levels;
}

std::vector<LayerPolicy> read_layer_policies(const Reader& r, const YAML::Node& node,
                                             const std::vector<int64_t>& ladder) {
  if (!node.IsSequence()) r.fail(node, "per_layer_policies", "must be a list");
  std::vector<LayerPolicy> out;
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    const std::string ctx = fmt::format("per_layer_policies[{}]", i);
    r.check_keys(item, ctx, {"layer_id", "kv_head_windows", "expected_distortion", "kv_head_rules"},
                 {"layer_id", "kv_head_windows"});
    LayerPolicy lp;
    lp.layer_id = r.non_negative(item["layer_id"], ctx + ".layer_id");
    const std::string lctx = fmt::format("per_layer_policies (layer {})", lp.layer_id);
    if (!out.empty() && lp.layer_id <= out.back().layer_id) {
      r.fail(item["layer_id"], lctx, "layer ids must be strictly ascending");
    }
    const YAML::Node& windows = item["kv_head_windows"];
    if (!windows.IsSequence() || windows.size() == 0)
      r.fail(windows, lctx + ".kv_head_windows", "must be a non-empty list");
    for (size_t h = 0; h < windows.size(); ++h) {
      const std::string key = fmt::format("{}.kv_head_windows[{}]", lctx, h);
      lp.kv_head_windows.push_back(r.window(windows[h], key));
    }
    if (const YAML::Node& d = item["expected_distortion"]) {
      if (!d.IsSequence() || d.size() != windows.size()) {
        r.fail(d, lctx + ".expected_distortion", "must list one value per KV head");
      }
      for (size_t h = 0; h < d.size(); ++h) {
        const double v = r.number(d[h], fmt::format("{}.expected_distortion[{}]", lctx, h));
        if (v < 0) r.fail(d[h], lctx + ".expected_distortion", "distortion must not be negative");
        lp.expected_distortion.push_back(v);
      }
    }
    if (const YAML::Node& rules = item["kv_head_rules"]) {
      if (!rules.IsSequence() || rules.size() != windows.size()) {
        r.fail(rules, lctx + ".kv_head_rules", "must list one rule per KV head");
      }
      for (size_t h = 0; h < rules.size(); ++h) {
        const std::string key = fmt::format("{}.kv_head_rules[{}]", lctx, h);
        const std::string name = rules[h].IsScalar() ? rules[h].Scalar() : "";
        const auto& known = keep_rule_names();
        if (std::find(known.begin(), known.end(), name) == known.end()) {
          r.fail(rules[h], key, fmt::format("must be one of {}", fmt::join(known, ", ")));
        }
        lp.kv_head_rules.push_back(keep_rule_from_name(name, key));
      }
    }
    // A window is a ladder level; a selecting head's window only sizes its slots, so any length
    // will do.
    for (size_t h = 0; h < windows.size(); ++h) {
      const int64_t w = lp.kv_head_windows[h];
      if (lp.rule(h) == KeepRule::kWindow &&
          std::find(ladder.begin(), ladder.end(), w) == ladder.end()) {
        r.fail(windows[h], fmt::format("{}.kv_head_windows[{}]", lctx, h),
               fmt::format("window {} is not one of window_levels", window_name(w)));
      }
    }
    out.push_back(std::move(lp));
  }
  return out;
}

PolicyMemory read_memory(const Reader& r, const YAML::Node& node) {
  const std::set<std::string> required{"total_bytes",        "global_kv_bytes", "local_kv_bytes",
                                       "linear_state_bytes", "ssm_state_bytes", "other_state_bytes",
                                       "full_kv_total_bytes"};
  std::set<std::string> keys = required;
  keys.insert("selection_state_bytes");
  r.check_keys(node, "memory", keys, required);
  PolicyMemory m;
  m.total_bytes = r.non_negative(node["total_bytes"], "memory.total_bytes");
  m.components.global_kv_bytes = r.non_negative(node["global_kv_bytes"], "memory.global_kv_bytes");
  m.components.local_kv_bytes = r.non_negative(node["local_kv_bytes"], "memory.local_kv_bytes");
  m.components.linear_state_bytes =
      r.non_negative(node["linear_state_bytes"], "memory.linear_state_bytes");
  m.components.ssm_state_bytes = r.non_negative(node["ssm_state_bytes"], "memory.ssm_state_bytes");
  m.components.other_state_bytes =
      r.non_negative(node["other_state_bytes"], "memory.other_state_bytes");
  if (node["selection_state_bytes"]) {
    m.components.selection_state_bytes =
        r.non_negative(node["selection_state_bytes"], "memory.selection_state_bytes");
  }
  m.full_kv_total_bytes = r.non_negative(node["full_kv_total_bytes"], "memory.full_kv_total_bytes");
  if (m.total_bytes != m.components.total()) {
    r.fail(node["total_bytes"], "memory.total_bytes",
           fmt::format("{} is not the sum of the components ({})", m.total_bytes,
                       m.components.total()));
  }
  return m;
}

std::vector<NonGlobalLayer> read_non_global(const Reader& r, const YAML::Node& node) {
  if (!node.IsSequence()) r.fail(node, "non_global_layers", "must be a list");
  std::vector<NonGlobalLayer> out;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string ctx = fmt::format("non_global_layers[{}]", i);
    r.check_keys(node[i], ctx, {"layer_id", "kind", "bytes"}, {"layer_id", "kind", "bytes"});
    NonGlobalLayer l;
    l.layer_id = r.non_negative(node[i]["layer_id"], ctx + ".layer_id");
    l.kind = r.scalar(node[i]["kind"], ctx + ".kind");
    arch::parse_layer_kind(l.kind, fmt::format("{}: {}.kind", r.where(), ctx));
    l.bytes = r.non_negative(node[i]["bytes"], ctx + ".bytes");
    out.push_back(std::move(l));
  }
  return out;
}

// A digest is lower-case hex (sha256: 64 digits). Anything else is a hand edit, and since the
// writer emits digests bare, a control character in one would not survive a rewrite (fuzzing
// found "nu\xff\r").
std::string hex_digest(const Reader& r, const YAML::Node& node, const std::string& key) {
  std::string digest = r.scalar(node, key);
  // Empty is what the writer emits for a policy that came without a fingerprint (hand-written).
  const bool hex = digest.size() <= 64 && std::all_of(digest.begin(), digest.end(), [](char c) {
                     return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                   });
  if (!hex)
    r.fail(node, key, "is not a hex digest (up to 64 digits 0-9a-f, as headwise writes sha256)");
  return digest;
}

EngineRecord read_engine(const Reader& r, const YAML::Node& node) {
  const std::set<std::string> keys{"name",
                                   "rules_version",
                                   "max_num_batched_tokens",
                                   "mamba_cache_mode",
                                   "attention_block_size",
                                   "total_bytes",
                                   "full_kv_total_bytes"};
  r.check_keys(node, "engine", keys, keys);
  EngineRecord e;
  e.name = r.scalar(node["name"], "engine.name");
  if (e.name != "vllm") r.fail(node["name"], "engine.name", "must be vllm");
  e.rules_version = r.scalar(node["rules_version"], "engine.rules_version");
  e.max_num_batched_tokens =
      r.positive(node["max_num_batched_tokens"], "engine.max_num_batched_tokens");
  e.mamba_cache_mode = r.scalar(node["mamba_cache_mode"], "engine.mamba_cache_mode");
  if (e.mamba_cache_mode != "none" && e.mamba_cache_mode != "align" && e.mamba_cache_mode != "all")
    r.fail(node["mamba_cache_mode"], "engine.mamba_cache_mode", "must be none, align or all");
  e.attention_block_size = r.positive(node["attention_block_size"], "engine.attention_block_size");
  e.total_bytes = r.non_negative(node["total_bytes"], "engine.total_bytes");
  e.full_kv_total_bytes = r.non_negative(node["full_kv_total_bytes"], "engine.full_kv_total_bytes");
  return e;
}

ModelFingerprint read_fingerprint(const Reader& r, const YAML::Node& node) {
  r.check_keys(node, "model_fingerprint", {"config_sha256", "weights_headers_sha256"},
               {"config_sha256"});
  ModelFingerprint f;
  f.config_sha256 = hex_digest(r, node["config_sha256"], "model_fingerprint.config_sha256");
  const YAML::Node& w = node["weights_headers_sha256"];
  if (w && !w.IsNull())
    f.weights_headers_sha256 = hex_digest(r, w, "model_fingerprint.weights_headers_sha256");
  return f;
}

Policy read_document(const Reader& r, const YAML::Node& root) {
  r.check_keys(
      root, "",
      {"schema", "model_name", "model_path", "model_fingerprint", "budget_gb", "context", "batch",
       "dtype", "state_dtype", "block_size", "sink_tokens", "window_levels", "calibration",
       "memory", "engine", "tensor_parallel_size", "non_global_layers", "per_layer_policies"},
      {"schema", "model_name", "budget_gb", "context", "batch", "dtype", "block_size",
       "sink_tokens", "window_levels", "per_layer_policies"});
  if (r.scalar(root["schema"], "schema") != kSchema) {
    r.fail(root["schema"], "schema",
           fmt::format("'{}' is not supported (expected {})", root["schema"].Scalar(), kSchema));
  }
  Policy p;
  p.model_name = r.scalar(root["model_name"], "model_name");
  if (root["model_path"]) p.model_path = r.scalar(root["model_path"], "model_path");
  if (root["model_fingerprint"]) p.fingerprint = read_fingerprint(r, root["model_fingerprint"]);
  p.budget_gb = r.number(root["budget_gb"], "budget_gb");
  if (p.budget_gb < 0) r.fail(root["budget_gb"], "budget_gb", "must not be negative");
  p.context = r.positive(root["context"], "context");
  p.batch = r.positive(root["batch"], "batch");
  p.dtype = parse_dtype(r.scalar(root["dtype"], "dtype"), fmt::format("{}: dtype", r.where()));
  // Absent in every policy written before the field: the states' native dtypes, as then.
  if (root["state_dtype"]) {
    p.state_dtype = parse_state_dtype(r.scalar(root["state_dtype"], "state_dtype"),
                                      fmt::format("{}: state_dtype", r.where()));
  }
  p.block_size = r.positive(root["block_size"], "block_size");
  p.sink_tokens = r.non_negative(root["sink_tokens"], "sink_tokens");
  p.window_levels = read_ladder(r, root["window_levels"]);
  if (root["calibration"]) {
    if (!root["calibration"].IsMap() && !root["calibration"].IsNull())
      r.fail(root["calibration"], "calibration", "must be a mapping");
    p.calibration = root["calibration"].IsNull() ? nlohmann::json::object()
                                                 : r.to_json(root["calibration"], "calibration");
  }
  if (root["memory"]) p.memory = read_memory(r, root["memory"]);
  if (root["engine"]) p.engine = read_engine(r, root["engine"]);
  if (root["tensor_parallel_size"])
    p.tensor_parallel_size = r.positive(root["tensor_parallel_size"], "tensor_parallel_size");
  if (root["non_global_layers"])
    p.non_global_layers = read_non_global(r, root["non_global_layers"]);
  p.per_layer_policies = read_layer_policies(r, root["per_layer_policies"], p.window_levels);
  if (p.tensor_parallel_size) {
    // Recorded only for windows that shard: every rank's shard of each layer holds the same ones.
    for (const auto& lp : p.per_layer_policies) {
      const int64_t heads = static_cast<int64_t>(lp.kv_head_windows.size());
      const int64_t tp = *p.tensor_parallel_size;
      if (heads >= tp ? heads % tp != 0 : tp % heads != 0) {
        r.fail(root["tensor_parallel_size"], "tensor_parallel_size",
               fmt::format("layer {}'s {} KV heads do not shard over {} ranks", lp.layer_id, heads,
                           tp));
      }
      if (auto why = memory::shard_mismatch(lp.kv_head_windows, tp)) {
        r.fail(root["tensor_parallel_size"], "tensor_parallel_size",
               fmt::format("layer {}'s windows do not shard over {} ranks: {}", lp.layer_id, tp,
                           *why));
      }
    }
  }
  return p;
}

}  // namespace

Policy from_yaml(std::string_view text, std::string_view where) {
  const Reader reader(where);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw_input_error("{}:{}:{}: broken YAML: {}", where, e.mark.line + 1, e.mark.column + 1,
                      e.msg);
  }
  if (!root.IsMap())
    throw_input_error("{}: a policy file must be a YAML mapping (schema: {})", where, kSchema);
  try {
    return read_document(reader, root);
  } catch (const YAML::Exception& e) {  // e.g. a non-scalar map key
    throw_input_error("{}:{}:{}: {}", where, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

}  // namespace headwise::policy

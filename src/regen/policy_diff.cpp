#include "headwise/regen/policy_diff.hpp"

#include <algorithm>
#include <map>
#include <sstream>

#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::regen {
namespace {

template <typename T>
void field(std::vector<std::string>& out, std::string_view name, const T& before, const T& after) {
  if (!(before == after)) out.push_back(fmt::format("{}: {} → {}", name, before, after));
}

std::string levels(const std::vector<int64_t>& windows) {
  std::vector<std::string> names;
  for (int64_t w : windows) names.push_back(policy::window_name(w));
  return fmt::format("[{}]", fmt::join(names, ", "));
}

std::string dump_or_absent(const nlohmann::json& j, const std::string& key) {
  return j.contains(key) ? j.at(key).dump() : std::string("(absent)");
}

void diff_layers(std::vector<std::string>& out, const policy::Policy& a, const policy::Policy& b,
                 const arch::ModelSpec& spec) {
  std::map<int64_t, const policy::LayerPolicy*> before, after;
  for (const auto& l : a.per_layer_policies) before[l.layer_id] = &l;
  for (const auto& l : b.per_layer_policies) after[l.layer_id] = &l;
  const memory::MemoryOptions mem_a = a.memory_options(), mem_b = b.memory_options();
  auto bytes = [&spec](int64_t layer, int64_t window,
                       const memory::MemoryOptions& mem) -> std::string {
    if (layer < 0 || layer >= spec.num_layers() || !spec.layer(layer).attention) return "?";
    return format_bytes(memory::head_bytes(*spec.layer(layer).attention, window, mem));
  };
  std::map<int64_t, int> layers;
  for (const auto& [id, _] : before) layers[id] |= 1;
  for (const auto& [id, _] : after) layers[id] |= 2;
  int distortion_changes = 0;
  for (const auto& [id, present] : layers) {
    if (present != 3) {
      out.push_back(
          fmt::format("layer {}: {}", id,
                      present == 1 ? "only in the committed policy" : "only in the new one"));
      continue;
    }
    const auto& wa = before[id]->kv_head_windows;
    const auto& wb = after[id]->kv_head_windows;
    for (size_t h = 0; h < std::max(wa.size(), wb.size()); ++h) {
      if (h >= wa.size() || h >= wb.size()) {
        out.push_back(fmt::format("layer {} KV head {}: present in only one policy", id, h));
      } else if (wa[h] != wb[h]) {
        out.push_back(fmt::format("layer {} KV head {}: window {} → {}, bytes {} → {}", id, h,
                                  policy::window_name(wa[h]), policy::window_name(wb[h]),
                                  bytes(id, wa[h], mem_a), bytes(id, wb[h], mem_b)));
      }
    }
    if (before[id]->expected_distortion != after[id]->expected_distortion) ++distortion_changes;
  }
  if (distortion_changes > 0) {
    out.push_back(
        fmt::format("expected_distortion changed in {} layer(s) (curves measured differently)",
                    distortion_changes));
  }
}

}  // namespace

std::vector<std::string> diff_policies(const policy::Policy& a, const policy::Policy& b,
                                       const arch::ModelSpec& spec) {
  std::vector<std::string> out;
  field(out, "model_name", a.model_name, b.model_name);
  field(out, "model_path", a.model_path, b.model_path);
  field(out, "model_fingerprint.config_sha256", a.fingerprint.config_sha256,
        b.fingerprint.config_sha256);
  field(out, "model_fingerprint.weights_headers_sha256",
        a.fingerprint.weights_headers_sha256.value_or("null"),
        b.fingerprint.weights_headers_sha256.value_or("null"));
  field(out, "budget_gb", a.budget_gb, b.budget_gb);
  field(out, "context", a.context, b.context);
  field(out, "batch", a.batch, b.batch);
  field(out, "dtype", std::string(dtype_name(a.dtype)), std::string(dtype_name(b.dtype)));
  const auto state = [](const policy::Policy& p) {
    return p.state_dtype ? std::string(dtype_name(*p.state_dtype))
                         : std::string("(absent: native)");
  };
  field(out, "state_dtype", state(a), state(b));
  field(out, "block_size", a.block_size, b.block_size);
  field(out, "sink_tokens", a.sink_tokens, b.sink_tokens);
  field(out, "window_levels", levels(a.window_levels), levels(b.window_levels));
  std::map<std::string, int> keys;
  for (const auto& [k, _] : a.calibration.items()) keys[k] |= 1;
  for (const auto& [k, _] : b.calibration.items()) keys[k] |= 2;
  for (const auto& [k, _] : keys) {
    const std::string va = dump_or_absent(a.calibration, k), vb = dump_or_absent(b.calibration, k);
    if (va != vb) out.push_back(fmt::format("calibration.{}: {} → {}", k, va, vb));
  }
  diff_layers(out, a, b, spec);
  if (a.memory.total_bytes != b.memory.total_bytes) {
    out.push_back(fmt::format("memory.total_bytes: {} → {} ({} → {})", a.memory.total_bytes,
                              b.memory.total_bytes, format_bytes(a.memory.total_bytes),
                              format_bytes(b.memory.total_bytes)));
  }
  return out;
}

std::string first_text_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ga = static_cast<bool>(std::getline(sa, la)),
               gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga && !gb) return "identical";
    if (!ga || !gb || la != lb) {
      return fmt::format("line {}: '{}' → '{}'", line, ga ? la : "(end of file)",
                         gb ? lb : "(end of file)");
    }
  }
}

}  // namespace headwise::regen

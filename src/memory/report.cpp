#include "headwise/memory/report.hpp"

#include <fmt/format.h>

#include <map>

#include "headwise/core/units.hpp"

namespace headwise::memory {
namespace {

nlohmann::json windows_json(const std::vector<int64_t>& windows) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t w : windows) {
    if (w == kFullWindow) out.push_back("full"); else out.push_back(w);
  }
  return out;
}

nlohmann::json capacity_json(const Capacity& c) {
  return {{"max_context", c.max_context ? nlohmann::json(*c.max_context) : nlohmann::json(nullptr)},
          {"max_batch", c.max_batch}};
}

nlohmann::json gpu_json(const GpuFit& g) {
  return {{"gpu_memory_bytes", g.gpu_memory_bytes}, {"reserve_bytes", g.reserve_bytes},
          {"weights_bytes", g.weights_bytes}, {"cache_budget_bytes", g.cache_budget_bytes},
          {"context_search_limit", kContextSearchLimit},
          {"full_kv", capacity_json(g.full_kv)}, {"policy", capacity_json(g.policy)}};
}

std::string pct(int64_t part, int64_t whole) {
  return whole == 0 ? "-" : fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string context_cell(const Capacity& c) {
  if (!c.max_context) return "unbounded";  // every window finite: the cache stops growing
  const std::string short_form = format_tokens(*c.max_context);
  return short_form == std::to_string(*c.max_context) ? short_form : fmt::format("{} ({})", *c.max_context, short_form);
}

std::string gpu_table(const Report& r) {
  const GpuFit& g = *r.gpu;
  std::string out = fmt::format("\nGPU fit: {} GPU - {} weights - {} reserve = {} for the cache\n",
                                format_bytes(g.gpu_memory_bytes), format_bytes(g.weights_bytes),
                                format_bytes(g.reserve_bytes), format_bytes(g.cache_budget_bytes));
  const auto& o = r.estimate.options;
  const std::string ctx_label = fmt::format("max context at batch {}", o.batch);
  const std::string batch_label = fmt::format("max batch at context {}", format_tokens(o.context));
  out += fmt::format("  {:<32} {:>26} {:>26}\n", "", "full KV", r.policy_label);
  out += fmt::format("  {:<32} {:>26} {:>26}\n", ctx_label, context_cell(g.full_kv), context_cell(g.policy));
  out += fmt::format("  {:<32} {:>26} {:>26}\n", batch_label, g.full_kv.max_batch, g.policy.max_batch);
  return out;
}

}  // namespace

nlohmann::json report_json(const Report& r) {
  const MemoryEstimate& e = r.estimate;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : e.layers) {
    layers.push_back({{"layer_id", l.layer_id}, {"kind", std::string(arch::layer_kind_name(l.kind))},
                      {"bytes", l.bytes}, {"kv_bytes", l.kv_bytes}, {"state_bytes", l.state_bytes},
                      {"kv_head_windows", l.kv_head_windows ? windows_json(*l.kv_head_windows) : nlohmann::json(nullptr)}});
  }
  const auto& c = e.components;
  nlohmann::json out = {
      {"model", r.model},
      {"policy", r.policy_label},
      {"context", e.options.context},
      {"batch", e.options.batch},
      {"block_size", e.options.block_size},
      {"kv_dtype", std::string(dtype_name(e.options.kv_dtype))},
      {"sink_tokens", e.options.sink_tokens},
      {"state_dtype", e.options.state_dtype ? nlohmann::json(std::string(dtype_name(*e.options.state_dtype)))
                                            : nlohmann::json(nullptr)},
      {"total_bytes", e.total_bytes},
      {"components", {{"global_kv_bytes", c.global_kv_bytes}, {"local_kv_bytes", c.local_kv_bytes},
                      {"linear_state_bytes", c.linear_state_bytes}, {"ssm_state_bytes", c.ssm_state_bytes},
                      {"other_state_bytes", c.other_state_bytes}}},
      {"full_kv_total_bytes", r.full_kv_total_bytes},
      {"saving_bytes", r.full_kv_total_bytes - e.total_bytes},
      {"weights_bytes", r.weights_bytes ? nlohmann::json(*r.weights_bytes) : nlohmann::json(nullptr)},
      {"layers", layers},
  };
  if (r.gpu) out["gpu_fit"] = gpu_json(*r.gpu);
  return out;
}

std::string report_table(const Report& r, bool per_layer) {
  const MemoryEstimate& e = r.estimate;
  const auto& o = e.options;
  std::string out = fmt::format("{} — {}\ncontext {} ({}), batch {}, KV {}, block {}, sinks {}{}\n\n", r.model,
                                r.policy_label, o.context, format_tokens(o.context), o.batch, dtype_name(o.kv_dtype),
                                o.block_size, o.sink_tokens,
                                o.state_dtype ? fmt::format(", states {}", dtype_name(*o.state_dtype)) : "");
  const auto row = [&](std::string_view name, int64_t bytes) {
    out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", name, bytes, format_bytes(bytes), pct(bytes, e.total_bytes));
  };
  out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", "component", "bytes", "", "share");
  row("global KV", e.components.global_kv_bytes);
  row("local (sliding) KV", e.components.local_kv_bytes);
  row("linear-attn state", e.components.linear_state_bytes);
  row("SSM state", e.components.ssm_state_bytes);
  row("other state", e.components.other_state_bytes);
  row("total", e.total_bytes);
  out += "\n";
  out += fmt::format("  {:<22} {:>20} {:>14}\n", "full KV (comparison)", r.full_kv_total_bytes, format_bytes(r.full_kv_total_bytes));
  const int64_t saving = r.full_kv_total_bytes - e.total_bytes;
  out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", "saving", saving, format_bytes(saving), pct(saving, r.full_kv_total_bytes));
  out += r.weights_bytes ? fmt::format("  {:<22} {:>20} {:>14}\n", "weights", *r.weights_bytes, format_bytes(*r.weights_bytes))
                         : fmt::format("  {:<22} {:>20}\n", "weights", "unknown (no safetensors)");
  if (per_layer) {
    out += fmt::format("\n  {:>5} {:<18} {:>16}  {}\n", "layer", "kind", "bytes", "KV head windows");
    for (const auto& l : e.layers) {
      std::string windows;
      if (l.kv_head_windows) {
        std::vector<std::string> names;
        for (int64_t w : *l.kv_head_windows) names.push_back(w == kFullWindow ? "full" : std::to_string(w));
        windows = fmt::format("[{}]", fmt::join(names, ", "));
      }
      out += fmt::format("  {:>5} {:<18} {:>16}  {}\n", l.layer_id, arch::layer_kind_name(l.kind), l.bytes, windows);
    }
  } else {
    std::map<std::string, std::pair<int64_t, int64_t>> by_kind;  // kind → (layers, bytes)
    for (const auto& l : e.layers) {
      auto& [n, bytes] = by_kind[std::string(arch::layer_kind_name(l.kind))];
      ++n;
      bytes += l.bytes;
    }
    out += fmt::format("\n  {:<18} {:>6} {:>20}   (--per-layer for every layer)\n", "layer kind", "layers", "bytes");
    for (const auto& [kind, nb] : by_kind) out += fmt::format("  {:<18} {:>6} {:>20}\n", kind, nb.first, nb.second);
  }
  if (r.gpu) out += gpu_table(r);
  return out;
}

}  // namespace headwise::memory

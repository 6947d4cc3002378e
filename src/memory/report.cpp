#include "headwise/memory/report.hpp"

#include <fmt/format.h>

#include <map>

#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/core/window_json.hpp"

namespace headwise::memory {
namespace {

nlohmann::json layers_json(const std::vector<LayerMemory>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& l : layers) {
    out.push_back({{"layer_id", l.layer_id},
                   {"kind", std::string(arch::layer_kind_name(l.kind))},
                   {"bytes", l.bytes},
                   {"kv_bytes", l.kv_bytes},
                   {"state_bytes", l.state_bytes},
                   {"kv_head_windows", l.kv_head_windows ? windows_json(*l.kv_head_windows)
                                                         : nlohmann::json(nullptr)}});
  }
  return out;
}

nlohmann::json components_json(const Components& c) {
  nlohmann::json out = {{"global_kv_bytes", c.global_kv_bytes},
                        {"local_kv_bytes", c.local_kv_bytes},
                        {"linear_state_bytes", c.linear_state_bytes},
                        {"ssm_state_bytes", c.ssm_state_bytes},
                        {"other_state_bytes", c.other_state_bytes}};
  if (c.selection_state_bytes > 0) out["selection_state_bytes"] = c.selection_state_bytes;
  return out;
}

std::string layers_table(const std::vector<LayerMemory>& layers, bool per_layer) {
  std::string out;
  if (per_layer) {
    out +=
        fmt::format("\n  {:>5} {:<18} {:>16}  {}\n", "layer", "kind", "bytes", "KV head windows");
    for (const auto& l : layers) {
      std::string windows;
      if (l.kv_head_windows) windows = fmt::format("[{}]", window_labels(*l.kv_head_windows, ", "));
      out += fmt::format("  {:>5} {:<18} {:>16}  {}\n", l.layer_id, arch::layer_kind_name(l.kind),
                         l.bytes, windows);
    }
  } else {
    std::map<std::string, std::pair<int64_t, int64_t>> by_kind;  // kind → (layers, bytes)
    for (const auto& l : layers) {
      auto& [n, bytes] = by_kind[std::string(arch::layer_kind_name(l.kind))];
      ++n;
      bytes += l.bytes;
    }
    out += fmt::format("\n  {:<18} {:>6} {:>20}   (--per-layer for every layer)\n", "layer kind",
                       "layers", "bytes");
    for (const auto& [kind, nb] : by_kind)
      out += fmt::format("  {:<18} {:>6} {:>20}\n", kind, nb.first, nb.second);
  }
  return out;
}

nlohmann::json capacity_json(const Capacity& c) {
  return {{"max_context", c.max_context ? nlohmann::json(*c.max_context) : nlohmann::json(nullptr)},
          {"max_batch", c.max_batch}};
}

nlohmann::json gpu_json(const GpuFit& g) {
  return {{"gpu_memory_bytes", g.gpu_memory_bytes},
          {"reserve_bytes", g.reserve_bytes},
          {"weights_bytes", g.weights_bytes},
          {"cache_budget_bytes", g.cache_budget_bytes},
          {"context_search_limit", kContextSearchLimit},
          {"full_kv", capacity_json(g.full_kv)},
          {"policy", capacity_json(g.policy)}};
}

std::string pct(int64_t part, int64_t whole) {
  return whole == 0 ? "-"
                    : fmt::format("{:.1f}%",
                                  100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

std::string context_cell(const Capacity& c) {
  if (!c.max_context) return "unbounded";  // every window finite: the cache stops growing
  const std::string short_form = format_tokens(*c.max_context);
  return short_form == std::to_string(*c.max_context)
             ? short_form
             : fmt::format("{} ({})", *c.max_context, short_form);
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
  out += fmt::format("  {:<32} {:>26} {:>26}\n", ctx_label, context_cell(g.full_kv),
                     context_cell(g.policy));
  out +=
      fmt::format("  {:<32} {:>26} {:>26}\n", batch_label, g.full_kv.max_batch, g.policy.max_batch);
  return out;
}

nlohmann::json headwise_json(const Report& r) {
  const MemoryEstimate& e = r.estimate;
  const auto& c = e.components;
  nlohmann::json out = {
      {"model", r.model},
      {"policy", r.policy_label},
      {"context", e.options.context},
      {"batch", e.options.batch},
      {"block_size", e.options.block_size},
      {"kv_dtype", std::string(dtype_name(e.options.kv_dtype))},
      {"sink_tokens", e.options.sink_tokens},
      {"state_dtype", e.options.state_dtype
                          ? nlohmann::json(std::string(dtype_name(*e.options.state_dtype)))
                          : nlohmann::json(nullptr)},
      {"total_bytes", e.total_bytes},
      {"components", components_json(c)},
      {"full_kv_total_bytes", r.full_kv_total_bytes},
      {"saving_bytes", r.full_kv_total_bytes - e.total_bytes},
      {"weights_bytes",
       r.weights_bytes ? nlohmann::json(*r.weights_bytes) : nlohmann::json(nullptr)},
      {"layers", layers_json(e.layers)},
  };
  if (r.gpu) out["gpu_fit"] = gpu_json(*r.gpu);
  return out;
}

std::string headwise_table(const Report& r, bool per_layer) {
  const MemoryEstimate& e = r.estimate;
  const auto& o = e.options;
  std::string out =
      fmt::format("{} — {}\ncontext {} ({}), batch {}, KV {}, block {}, sinks {}{}\n\n", r.model,
                  r.policy_label, o.context, format_tokens(o.context), o.batch,
                  dtype_name(o.kv_dtype), o.block_size, o.sink_tokens,
                  o.state_dtype ? fmt::format(", states {}", dtype_name(*o.state_dtype)) : "");
  const auto row = [&](std::string_view name, int64_t bytes) {
    out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", name, bytes, format_bytes(bytes),
                       pct(bytes, e.total_bytes));
  };
  out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", "component", "bytes", "", "share");
  row("global KV", e.components.global_kv_bytes);
  row("local (sliding) KV", e.components.local_kv_bytes);
  row("linear-attn state", e.components.linear_state_bytes);
  row("SSM state", e.components.ssm_state_bytes);
  row("other state", e.components.other_state_bytes);
  if (e.components.selection_state_bytes > 0)
    row("token selection", e.components.selection_state_bytes);
  row("total", e.total_bytes);
  out += "\n";
  out += fmt::format("  {:<22} {:>20} {:>14}\n", "full KV (comparison)", r.full_kv_total_bytes,
                     format_bytes(r.full_kv_total_bytes));
  const int64_t saving = r.full_kv_total_bytes - e.total_bytes;
  out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", "saving", saving, format_bytes(saving),
                     pct(saving, r.full_kv_total_bytes));
  out += r.weights_bytes ? fmt::format("  {:<22} {:>20} {:>14}\n", "weights", *r.weights_bytes,
                                       format_bytes(*r.weights_bytes))
                         : fmt::format("  {:<22} {:>20}\n", "weights", "unknown (no safetensors)");
  out += layers_table(e.layers, per_layer);
  if (r.gpu) out += gpu_table(r);
  return out;
}

nlohmann::json vllm_groups_json(const VllmEstimate& e) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& g : e.groups) {
    const VllmSpec& first = e.specs[static_cast<size_t>(g.specs.front())];
    nlohmann::json layers = nlohmann::json::array();
    for (int64_t i : g.specs) layers.push_back(e.specs[static_cast<size_t>(i)].layer_id);
    out.push_back(
        {{"kind", std::string(vllm_spec_kind_name(first.kind))},
         {"window", first.kind == VllmSpecKind::kSlidingWindow ? nlohmann::json(first.window)
                                                               : nlohmann::json(nullptr)},
         {"num_kv_heads", first.kind == VllmSpecKind::kMamba ? nlohmann::json(nullptr)
                                                             : nlohmann::json(first.num_kv_heads)},
         {"block_size", first.block_size},
         {"page_bytes", first.page_bytes},
         {"pages_per_request", first.pages_per_request},
         {"layers", layers},
         {"padding_slots", g.padding_slots}});
  }
  return out;
}

// Every stage together (under pipeline parallelism), else the one estimate.
int64_t deployment_bytes(const std::vector<VllmStage>& stages, int64_t single) {
  if (stages.empty()) return single;
  int64_t total = 0;
  for (const auto& s : stages) total += s.total_bytes;
  return total;
}

nlohmann::json stages_json(const VllmReport& v) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < v.stages.size(); ++i) {
    const VllmStage& s = v.stages[i];
    out.push_back({{"stage", i},
                   {"first_layer", s.first_layer},
                   {"last_layer", s.end_layer - 1},
                   {"specs", s.specs},
                   {"slots", s.slots},
                   {"blocks_per_request", s.blocks},
                   {"own_bytes", s.own_bytes},
                   {"total_bytes", s.total_bytes},
                   {"full_kv_total_bytes", v.full_kv_stages.at(i).total_bytes}});
  }
  return out;
}

std::string stages_table(const VllmReport& v) {
  std::string out = fmt::format(
      "  pipeline parallel {}: {} batches in flight; the groups are the whole model's, and each "
      "stage reserves{}:\n",
      v.pipeline_parallel_size, v.estimate.vllm.in_flight_batches,
      v.tensor_parallel_size > 1 ? " (per tensor-parallel rank)" : "");
  out += fmt::format("  {:>7} {:>9} {:>6} {:>6} {:>8} {:>16} {:>16} {:>16}\n", "stage", "layers",
                     "specs", "slots", "blocks", "own pages B", "bytes", "full KV bytes");
  for (size_t i = 0; i < v.stages.size(); ++i) {
    const VllmStage& s = v.stages[i];
    out += fmt::format("  {:>7} {:>9} {:>6} {:>6} {:>8} {:>16} {:>16} {:>16}\n", i,
                       fmt::format("{}-{}", s.first_layer, s.end_layer - 1), s.specs, s.slots,
                       s.blocks, s.own_bytes, s.total_bytes, v.full_kv_stages.at(i).total_bytes);
  }
  const int64_t all = deployment_bytes(v.stages, 0);
  out += fmt::format("  every stage{}: {} B ({})\n", v.tensor_parallel_size > 1 ? " and rank" : "",
                     v.tensor_parallel_size * all, format_bytes(v.tensor_parallel_size * all));
  return out;
}

nlohmann::json vllm_json(const Report& r) {
  const VllmReport& v = *r.vllm;
  const VllmEstimate& e = v.estimate;
  nlohmann::json out = {
      {"engine", "vllm"},
      {"vllm_rules_version", std::string(vllm_rules_version())},
      {"model", r.model},
      {"policy", r.policy_label},
      {"context", e.options.context},
      {"max_model_len", e.options.context},
      {"batch", e.options.batch},
      {"block_size", e.options.block_size},
      {"attention_block_size", e.block_size},
      {"page_bytes", e.page_bytes},
      {"kv_dtype", std::string(dtype_name(e.options.kv_dtype))},
      {"state_dtype", e.options.state_dtype
                          ? nlohmann::json(std::string(dtype_name(*e.options.state_dtype)))
                          : nlohmann::json(nullptr)},
      {"max_num_batched_tokens", e.vllm.max_num_batched_tokens},
      {"mamba_cache_mode", std::string(mamba_cache_mode_name(e.vllm.mamba_cache_mode))},
      {"group_size", e.group_size},
      {"kv_cache_groups", vllm_groups_json(e)},
      {"total_bytes", e.total_bytes},
      {"components", components_json(e.components)},
      {"padding_layer_bytes", e.padding_layer_bytes},
      {"page_padding_bytes", e.page_padding_bytes},
      {"full_kv_total_bytes", v.full_kv_total_bytes},
      {"saving_bytes", v.full_kv_total_bytes - e.total_bytes},
      {"weights_bytes",
       r.weights_bytes ? nlohmann::json(*r.weights_bytes) : nlohmann::json(nullptr)},
      {"layers", layers_json(e.layers)},
  };
  // Under tensor parallelism every figure above is one rank's (vLLM's own per-rank view).
  out["tensor_parallel_size"] = v.tensor_parallel_size;
  out["pipeline_parallel_size"] = v.pipeline_parallel_size;
  out["in_flight_batches"] = e.vllm.in_flight_batches;
  out["all_ranks_bytes"] = v.tensor_parallel_size * deployment_bytes(v.stages, e.total_bytes);
  out["all_ranks_full_kv_bytes"] =
      v.tensor_parallel_size * deployment_bytes(v.full_kv_stages, v.full_kv_total_bytes);
  if (v.pipeline_parallel_size > 1) out["stages"] = stages_json(v);
  if (r.gpu && v.gpu_full_kv && v.gpu_policy) {
    GpuFit g = *r.gpu;
    g.full_kv = *v.gpu_full_kv;
    g.policy = *v.gpu_policy;
    out["gpu_fit"] = gpu_json(g);
    if (v.tensor_parallel_size > 1) {
      out["gpu_fit"]["per_rank"] = true;
      out["gpu_fit"]["weights_source"] =
          r.weights_split_evenly ? "checkpoint / tensor_parallel_size" : "--weights-bytes";
    }
  }
  return out;
}

// One row per component of the side-by-side comparison, with why vLLM reserves otherwise.
struct Difference {
  std::string_view component;
  int64_t headwise = 0;
  int64_t vllm = 0;
  std::string_view why;
};

std::vector<Difference> differences(const Report& r) {
  const Components& h = r.estimate.components;
  const VllmEstimate& v = r.vllm->estimate;
  const Components& c = v.components;
  return {
      {"global KV", h.global_kv_bytes, c.global_kv_bytes,
       "full heads: cdiv(L, block) pages in both; a window W keeps min(W + sinks, C) tokens per "
       "head in headwise, "
       "min(W - 1 + max_num_batched_tokens, L) tokens + 1 block per window class in vLLM"},
      {"local (sliding) KV", h.local_kv_bytes, c.local_kv_bytes,
       "headwise keeps W - 1 tokens; vLLM reserves min(W - 1 + max_num_batched_tokens, L) tokens + "
       "1 block "
       "(chunked prefill)"},
      {"linear-attn state", h.linear_state_bytes, c.linear_state_bytes,
       "vLLM keeps kernel - 1 conv columns at the model dtype and the recurrent state at "
       "mamba_ssm_cache_dtype, "
       "pads the page to the attention page, and keeps 1/2/cdiv(L, block) pages "
       "(mamba_cache_mode)"},
      {"SSM state", h.ssm_state_bytes, c.ssm_state_bytes,
       "as linear-attn state: kernel - 1 conv columns, dtypes, page padding, mamba_cache_mode"},
      {"other state", h.other_state_bytes, c.other_state_bytes,
       "as linear-attn state (conv states keep kernel - 1)"},
      {"padding layers", 0, v.padding_layer_bytes,
       "vLLM's KV cache groups have equal slot counts; an empty slot still holds its group's "
       "pages"},
      {"total", r.estimate.total_bytes, v.total_bytes, ""},
  };
}

nlohmann::json both_json(const Report& r) {
  nlohmann::json diff = nlohmann::json::array();
  for (const auto& d : differences(r)) {
    diff.push_back({{"component", std::string(d.component)},
                    {"headwise_bytes", d.headwise},
                    {"vllm_bytes", d.vllm},
                    {"difference_bytes", d.vllm - d.headwise},
                    {"why", d.vllm == d.headwise ? nlohmann::json(nullptr)
                                                 : nlohmann::json(std::string(d.why))}});
  }
  return {{"engine", "both"},
          {"vllm_rules_version", std::string(vllm_rules_version())},
          {"headwise", headwise_json(r)},
          {"vllm", vllm_json(r)},
          {"difference", diff}};
}

std::string vllm_header(const Report& r) {
  const VllmEstimate& e = r.vllm->estimate;
  return fmt::format(
      "vLLM {} allocation rules: max_model_len {}, max_num_batched_tokens {}, mamba_cache_mode {}\n"
      "  attention block {} tokens (asked {}), page {} B, {} KV cache groups of {} slots, page "
      "padding {}\n",
      vllm_rules_version(), e.options.context, e.vllm.max_num_batched_tokens,
      mamba_cache_mode_name(e.vllm.mamba_cache_mode), e.block_size, e.options.block_size,
      e.page_bytes, e.groups.size(), e.group_size, format_bytes(e.page_padding_bytes));
}

std::string vllm_gpu_table(const Report& r) {
  GpuFit g = *r.gpu;
  g.full_kv = *r.vllm->gpu_full_kv;
  g.policy = *r.vllm->gpu_policy;
  Report copy = r;
  copy.gpu = g;
  return gpu_table(copy);
}

std::string vllm_table(const Report& r, bool per_layer) {
  const VllmEstimate& e = r.vllm->estimate;
  const auto& o = e.options;
  std::string out =
      fmt::format("{} — {}\ncontext {} ({}), batch {}, KV {}{}\n", r.model, r.policy_label,
                  o.context, format_tokens(o.context), o.batch, dtype_name(o.kv_dtype),
                  o.state_dtype ? fmt::format(", states {}", dtype_name(*o.state_dtype)) : "");
  out += vllm_header(r);
  if (r.vllm->tensor_parallel_size > 1 && r.vllm->pipeline_parallel_size == 1) {
    const int64_t tp = r.vllm->tensor_parallel_size;
    out += fmt::format(
        "  tensor parallel {}: every figure below is one rank's; all {} ranks reserve {} B ({})\n",
        tp, tp, tp * e.total_bytes, format_bytes(tp * e.total_bytes));
  }
  if (r.vllm->tensor_parallel_size > 1 && r.gpu) {
    out += fmt::format("  --gpu-memory is each GPU's, holding one rank's weights{}\n",
                       r.weights_split_evenly
                           ? " (the checkpoint's / tensor_parallel_size: replicated tensors "
                             "make a rank's share larger; --weights-bytes gives vLLM's figure)"
                           : " (--weights-bytes)");
  }
  if (r.vllm->pipeline_parallel_size > 1) {
    out += stages_table(*r.vllm);
    out += fmt::format("  the components below are the whole model's groups{}, no single stage's\n",
                       r.vllm->tensor_parallel_size > 1 ? " on one tensor-parallel rank" : "");
  }
  out += "\n";
  out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", "component", "bytes", "", "share");
  for (const auto& d : differences(r)) {
    out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", d.component, d.vllm, format_bytes(d.vllm),
                       pct(d.vllm, e.total_bytes));
  }
  const int64_t full = r.vllm->full_kv_total_bytes;
  out +=
      fmt::format("\n  {:<22} {:>20} {:>14}\n", "full KV (comparison)", full, format_bytes(full));
  out += fmt::format("  {:<22} {:>20} {:>14} {:>7}\n", "saving", full - e.total_bytes,
                     format_bytes(full - e.total_bytes), pct(full - e.total_bytes, full));
  out += layers_table(e.layers, per_layer);
  if (r.gpu) out += vllm_gpu_table(r);
  return out;
}

std::string both_table(const Report& r, bool per_layer) {
  const auto& o = r.estimate.options;
  std::string out = fmt::format(
      "{} — {}\ncontext {} ({}), batch {}, KV {}, block {}{}\n", r.model, r.policy_label, o.context,
      format_tokens(o.context), o.batch, dtype_name(o.kv_dtype), o.block_size,
      o.state_dtype ? fmt::format(", states {}", dtype_name(*o.state_dtype)) : "");
  out += vllm_header(r) + "\n";
  out += fmt::format("  {:<20} {:>14} {:>14} {:>14}  {}\n", "component", "headwise", "vLLM",
                     "vLLM - headwise", "why");
  for (const auto& d : differences(r)) {
    std::string row = fmt::format("  {:<20} {:>14} {:>14} {:>14}  {}", d.component,
                                  format_bytes(d.headwise), format_bytes(d.vllm),
                                  d.vllm == d.headwise ? "0 B" : format_bytes(d.vllm - d.headwise),
                                  d.vllm == d.headwise ? "" : d.why);
    row.erase(row.find_last_not_of(' ') +
              1);  // no trailing blanks where there is nothing to explain
    out += row + "\n";
  }
  out += fmt::format("\n  exact bytes: headwise {}, vLLM {}; full KV: headwise {}, vLLM {}\n",
                     r.estimate.total_bytes, r.vllm->estimate.total_bytes, r.full_kv_total_bytes,
                     r.vllm->full_kv_total_bytes);
  if (per_layer) {
    out += fmt::format("\n  {:>5} {:<18} {:>16} {:>16}\n", "layer", "kind", "headwise", "vLLM");
    const auto& hl = r.estimate.layers;
    const auto& vl = r.vllm->estimate.layers;
    for (size_t i = 0; i < hl.size() && i < vl.size(); ++i) {
      out += fmt::format("  {:>5} {:<18} {:>16} {:>16}\n", hl[i].layer_id,
                         arch::layer_kind_name(hl[i].kind), hl[i].bytes, vl[i].bytes);
    }
  }
  if (r.gpu) {
    out += "\nheadwise" + gpu_table(r);
    out += "\nvLLM" + vllm_gpu_table(r);
  }
  return out;
}

}  // namespace

Engine parse_engine(std::string_view text) {
  if (text == "headwise") return Engine::kHeadwise;
  if (text == "vllm") return Engine::kVllm;
  if (text == "both") return Engine::kBoth;
  throw_field_error("engine", ": expected headwise, vllm or both, got '{}'", text);
}

nlohmann::json report_json(const Report& r) {
  switch (r.engine) {
    case Engine::kHeadwise:
      return headwise_json(r);
    case Engine::kVllm:
      return vllm_json(r);
    case Engine::kBoth:
      return both_json(r);
  }
  HEADWISE_CHECK(false, "unknown engine");
}

std::string report_table(const Report& r, bool per_layer) {
  switch (r.engine) {
    case Engine::kHeadwise:
      return headwise_table(r, per_layer);
    case Engine::kVllm:
      return vllm_table(r, per_layer);
    case Engine::kBoth:
      return both_table(r, per_layer);
  }
  HEADWISE_CHECK(false, "unknown engine");
}

}  // namespace headwise::memory

#include "headwise/calib/engine.hpp"

#include <algorithm>
#include <optional>

#include "headwise/calib/keep_rules.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/solve/mckp.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace headwise::calib {

ServingEngine parse_serving_engine(std::string_view text) {
  if (text == "headwise") return ServingEngine::kHeadwise;
  if (text == "vllm") return ServingEngine::kVllm;
  throw_field_error("engine",
                    ": '{}' is not an engine: headwise (the default: headwise's runtime and "
                    "transformers' cache) or vllm (vLLM's allocator, python/headwise_vllm)",
                    text);
}

std::string_view serving_engine_name(ServingEngine engine) {
  return engine == ServingEngine::kVllm ? "vllm" : "headwise";
}

std::string engine_keep_rules(const std::string& text, DistortionMeasure measure,
                              ServingEngine engine) {
  if (engine == ServingEngine::kHeadwise) return resolve_keep_rules(text, measure);
  if (text == "auto" || parse_keep_rules(text).empty()) return "window";
  throw_field_error("keep_rules",
                    " {}: vLLM serves window rules only (it selects no tokens); drop it or use {} "
                    "window with {} vllm",
                    text, field_ref("keep_rules"), field_ref("engine"));
}

void check_engine_options(ServingEngine engine, const memory::MemoryOptions& memory,
                          const memory::VllmOptions& vllm) {
  if (engine != ServingEngine::kVllm) return;
  if (memory.sink_tokens != 0) {
    throw_field_error("sink_tokens",
                      " {}: vLLM's sliding windows keep no sink tokens; use 0 with {} vllm",
                      memory.sink_tokens, field_ref("engine"));
  }
  memory::validate_vllm_options(vllm);
}

EngineBytes::EngineBytes(const arch::ModelSpec& spec, const memory::MemoryOptions& memory,
                         ServingEngine engine, const memory::VllmOptions& vllm)
    : spec_(spec), memory_(memory), engine_(engine), vllm_(vllm) {
  check_engine_options(engine, memory, vllm);
}

int64_t EngineBytes::fixed() const {
  return engine_ == ServingEngine::kVllm ? memory::vllm_fixed_bytes(spec_, memory_, vllm_)
                                         : memory::fixed_bytes(spec_, memory_);
}

int64_t EngineBytes::head(const arch::LayerSpec& layer, int64_t window) const {
  return engine_ == ServingEngine::kVllm
             ? memory::vllm_head_bytes(spec_, layer, window, memory_, vllm_)
             : memory::head_bytes(*layer.attention, window, memory_);
}

HeadBytesFn EngineBytes::head_fn() const {
  // A copy: the function outlives nothing it needs but the spec.
  return [bytes = *this](const arch::LayerSpec& layer, int64_t window) {
    return bytes.head(layer, window);
  };
}

int64_t EngineBytes::total(const memory::HeadWindows& windows) const {
  return engine_ == ServingEngine::kVllm
             ? memory::vllm_estimate(spec_, windows, memory_, vllm_).total_bytes
             : memory::estimate(spec_, windows, memory_).total_bytes;
}

int64_t EngineBytes::minimum(const std::vector<int64_t>& ladder) const {
  HEADWISE_CHECK(!ladder.empty(), "an empty window ladder");
  memory::HeadWindows windows;
  for (int64_t id : spec_.global_layer_ids()) {
    const arch::LayerSpec& layer = spec_.layer(id);
    int64_t cheapest = ladder.front();
    for (int64_t w : ladder) {
      // Fewer bytes wins; equal bytes, the larger window (a window priced as full is full).
      if (head(layer, w) < head(layer, cheapest) ||
          (head(layer, w) == head(layer, cheapest) && w > cheapest))
        cheapest = w;
    }
    if (engine_ == ServingEngine::kVllm &&
        memory::vllm_serves_as_full(spec_, layer, cheapest, memory_, vllm_))
      cheapest = memory::kFullWindow;
    windows[id].assign(static_cast<size_t>(layer.attention->num_kv_heads), cheapest);
  }
  return total(windows);
}

int64_t EngineBytes::full() const {
  return total(memory::full_kv_windows(spec_));
}

std::optional<std::string> engine_parameters_notice(const policy::Policy& policy,
                                                    const memory::MemoryOptions& serving,
                                                    const memory::VllmOptions& vllm) {
  if (!policy.engine) return std::nullopt;
  std::vector<std::string> calibrated, given;
  const auto compare = [&](std::string_view name, const std::string& at_calibration,
                           const std::string& now) {
    if (at_calibration == now) return;
    calibrated.push_back(fmt::format("{} {}", name, at_calibration));
    given.push_back(fmt::format("{} {}", name, now));
  };
  compare("max_num_batched_tokens", std::to_string(policy.engine->max_num_batched_tokens),
          std::to_string(vllm.max_num_batched_tokens));
  compare("block_size", std::to_string(policy.block_size), std::to_string(serving.block_size));
  compare("max_model_len", std::to_string(policy.context), std::to_string(serving.context));
  compare("batch", std::to_string(policy.batch), std::to_string(serving.batch));
  compare("kv_dtype", std::string(dtype_name(policy.dtype)),
          std::string(dtype_name(serving.kv_dtype)));
  compare("mamba_cache_mode", policy.engine->mamba_cache_mode,
          std::string(memory::mamba_cache_mode_name(vllm.mamba_cache_mode)));
  if (calibrated.empty()) return std::nullopt;
  return fmt::format(
      "calibrated for {} at {}, now {}: its budget ({} B in {}'s bytes) holds at its own "
      "parameters only",
      policy.engine->name, fmt::join(calibrated, ", "), fmt::join(given, ", "),
      policy.engine->total_bytes, policy.engine->name);
}

void refuse_budget_below_engine_minimum(const EngineBytes& bytes,
                                        const std::vector<int64_t>& ladder, int64_t budget) {
  if (bytes.engine() != ServingEngine::kVllm) return;
  if (std::find(ladder.begin(), ladder.end(), memory::kFullWindow) == ladder.end()) {
    throw_field_error("windows",
                      " must end with full with {} vllm: a window that vLLM reserves as much for "
                      "as full KV is served as full",
                      field_ref("engine"));
  }
  const int64_t minimum = bytes.minimum(ladder);
  if (budget >= minimum) return;
  const int64_t full = bytes.full();
  throw InfeasibleFieldError(
      "budget",
      fmt::format("{} {} is below the minimum {} ({} bytes) that vLLM reserves for a policy of "
                  "this ladder at context {} and {} {} ({} for the non-global layers; full KV "
                  "reserves {} bytes{})",
                  field_ref("budget"), format_bytes(budget), format_bytes(minimum), minimum,
                  bytes.memory().context, field_ref("max_num_batched_tokens"),
                  bytes.vllm().max_num_batched_tokens, format_bytes(bytes.fixed()), full,
                  minimum == full ? ": no window reserves less than full here, so a budget below "
                                    "full KV's cannot be met"
                                  : ""));
}

std::optional<policy::EngineRecord> engine_record(const EngineBytes& bytes,
                                                  const memory::HeadWindows& windows) {
  if (bytes.engine() != ServingEngine::kVllm) return std::nullopt;
  policy::EngineRecord record;
  record.name = "vllm";
  record.rules_version = std::string(memory::vllm_rules_version());
  record.max_num_batched_tokens = bytes.vllm().max_num_batched_tokens;
  record.mamba_cache_mode =
      std::string(memory::mamba_cache_mode_name(bytes.vllm().mamba_cache_mode));
  record.attention_block_size = memory::vllm_block_size(bytes.spec(), bytes.memory(), bytes.vllm());
  record.total_bytes = bytes.total(windows);
  record.full_kv_total_bytes = bytes.full();
  return record;
}

EngineFit fit_to_engine(const EngineBytes& bytes, const std::vector<HeadCurve>& curves,
                        const std::map<int64_t, std::vector<int64_t>>& windows,
                        const std::map<int64_t, std::vector<double>>& distortion, int64_t budget) {
  EngineFit out;
  out.windows = windows;
  out.expected_distortion = distortion;
  if (bytes.engine() == ServingEngine::kHeadwise) {
    out.total_bytes = bytes.total(windows);
    return out;
  }
  // One knapsack group per head, in layer and head order; its options are the curve's levels.
  std::vector<solve::Group> groups;
  std::vector<size_t> start;
  for (const auto& [layer_id, heads] : windows) {
    for (size_t h = 0; h < heads.size(); ++h) {
      const auto curve = std::find_if(curves.begin(), curves.end(), [&](const HeadCurve& c) {
        return c.layer_id == layer_id && c.kv_head == static_cast<int64_t>(h);
      });
      HEADWISE_CHECK(curve != curves.end(), "no curve for layer {} head {}", layer_id, h);
      // A level that reserves at least full's bytes is never chosen: the head gets full.
      const arch::LayerSpec& layer = bytes.spec().layer(layer_id);
      const auto as_full = [&](int64_t w) {
        return memory::vllm_serves_as_full(bytes.spec(), layer, w, bytes.memory(), bytes.vllm());
      };
      const int64_t walked = as_full(heads[h]) ? memory::kFullWindow : heads[h];
      solve::Group group{layer_id, static_cast<int64_t>(h), {}};
      std::optional<size_t> at;
      for (size_t l = 0; l < curve->windows.size(); ++l) {
        const int64_t w = curve->windows[l];
        if (w != memory::kFullWindow && as_full(w)) continue;
        if (w == walked) at = group.options.size();
        group.options.push_back({w, curve->bytes[l], curve->distortion[l]});
      }
      if (!at) {
        throw_field_error("windows",
                          ": with {} vllm the ladder must hold full (layer {} head {} has window "
                          "{}, which vLLM reserves as much for as full)",
                          field_ref("engine"), layer_id, h, heads[h]);
      }
      groups.push_back(std::move(group));
      start.push_back(*at);
    }
  }
  const auto windows_of = [&](const std::vector<size_t>& choice) {
    memory::HeadWindows w;
    for (size_t g = 0; g < groups.size(); ++g)
      w[groups[g].layer_id].push_back(groups[g].options[choice[g]].window);
    return w;
  };
  solve::SolveResult fit;
  try {
    fit = solve::fit_coupled(
        groups, start, [&](const std::vector<size_t>& c) { return bytes.total(windows_of(c)); },
        budget);
  } catch (const InfeasibleError& e) {
    throw InfeasibleFieldError(
        "budget", fmt::format("{} {} does not hold the policy in vLLM's reservation: {}",
                              field_ref("budget"), format_bytes(budget), e.what()));
  }
  out.windows = windows_of(fit.choice);
  out.total_bytes = fit.total_bytes;
  out.expected_distortion.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    out.expected_distortion[groups[g].layer_id].push_back(
        groups[g].options[fit.choice[g]].distortion);
    out.heads_moved += fit.choice[g] != start[g];
  }
  return out;
}

}  // namespace headwise::calib

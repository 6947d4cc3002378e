#include "headwise/memory/memory_model.hpp"

#include <algorithm>

#include "checked.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"

namespace headwise::memory {
namespace {

// Bytes of K and V for `slots` tokens of `heads` heads, one sequence.
int64_t kv_bytes(int64_t slots, int64_t heads, int64_t head_dim, const MemoryOptions& options) {
  return checked_mul(checked_mul(checked_mul(slots, heads), head_dim),
                     2 * element_size(options.kv_dtype));
}

int64_t& component_of(Components& c, arch::StateClass state_class) {
  switch (state_class) {
    case arch::StateClass::kLinearState:
      return c.linear_state_bytes;
    case arch::StateClass::kSsmState:
      return c.ssm_state_bytes;
    case arch::StateClass::kOtherState:
      return c.other_state_bytes;
  }
  HEADWISE_CHECK(false, "unknown state class");
}

// One layer's KV bytes per sequence (global: per-head windows; sliding: its buffer).
int64_t layer_kv_bytes_per_sequence(const arch::LayerSpec& layer,
                                    const std::vector<int64_t>* windows,
                                    const MemoryOptions& options) {
  if (!layer.attention) return 0;
  const auto& att = *layer.attention;
  if (layer.is_sliding())
    return kv_bytes(sliding_layer_slots(att, options), att.num_kv_heads, att.head_dim, options);
  HEADWISE_CHECK(windows != nullptr, "global layer {} has no windows", layer.id);
  int64_t bytes = 0;
  for (int64_t w : *windows)
    bytes = checked_add(bytes, kv_bytes(global_head_slots(w, options), 1, att.head_dim, options));
  return bytes;
}

}  // namespace

void validate_options(const MemoryOptions& o) {
  if (o.context <= 0)
    throw_field_error("context", ": must be a positive number of tokens, got {}", o.context);
  if (o.batch <= 0)
    throw_field_error("batch", ": must be a positive number of sequences, got {}", o.batch);
  if (o.block_size <= 0)
    throw_field_error("block_size", ": must be a positive number of tokens, got {}", o.block_size);
  if (o.sink_tokens < 0)
    throw_field_error("sink_tokens", ": must not be negative, got {}", o.sink_tokens);
  switch (o.kv_dtype) {
    case DType::kBFloat16:
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      break;
    default:
      throw_field_error("kv_dtype",
                        ": {} is not a KV cache type (bfloat16, float16, float32, float8_e4m3fn)",
                        dtype_name(o.kv_dtype));
  }
}

int64_t Components::total() const {
  return global_kv_bytes + local_kv_bytes + linear_state_bytes + ssm_state_bytes +
         other_state_bytes + selection_state_bytes;
}

HeadWindows full_kv_windows(const arch::ModelSpec& spec) {
  return uniform_windows(spec, kFullWindow);
}

HeadWindows uniform_windows(const arch::ModelSpec& spec, int64_t window) {
  if (window < 0) throw_field_error("uniform_window", ": must be positive, got {}", window);
  HeadWindows out;
  for (const auto& layer : spec.layers) {
    if (layer.is_global())
      out[layer.id] =
          std::vector<int64_t>(static_cast<size_t>(layer.attention->num_kv_heads), window);
  }
  return out;
}

void validate_windows(const arch::ModelSpec& spec, const HeadWindows& windows) {
  for (const auto& [id, heads] : windows) {
    if (id < 0 || id >= spec.num_layers() || !spec.layer(id).is_global()) {
      throw_input_error(
          "layer {}: is not a global attention layer of the {} model (global layers: {})", id,
          spec.model_type, fmt::join(spec.global_layer_ids(), ", "));
    }
    const int64_t expected = spec.layer(id).attention->num_kv_heads;
    if (static_cast<int64_t>(heads.size()) != expected) {
      throw_input_error("layer {}: has {} KV head windows, the model has {} KV heads", id,
                        heads.size(), expected);
    }
    for (int64_t w : heads) {
      if (w < 0) throw_input_error("layer {}: window {} is negative", id, w);
    }
  }
  for (int64_t id : spec.global_layer_ids()) {
    if (!windows.contains(id))
      throw_input_error("layer {}: global layer has no KV head windows", id);
  }
}

int64_t global_head_slots(int64_t window, const MemoryOptions& o) {
  const int64_t tokens =
      window == kFullWindow ? o.context : std::min(checked_add(window, o.sink_tokens), o.context);
  return round_up(tokens, o.block_size);
}

int64_t sliding_layer_slots(const arch::AttentionShape& attention, const MemoryOptions& o) {
  const int64_t cache = attention.sliding_cache_tokens > 0 ? attention.sliding_cache_tokens
                                                           : attention.sliding_window;
  return round_up(std::min(cache, o.context), o.block_size);
}

int64_t state_bytes_per_sequence(const arch::StateTensorSpec& state, const MemoryOptions& o) {
  int64_t n = element_size(o.state_dtype.value_or(state.dtype));
  for (int64_t d : state.shape) n = checked_mul(n, d);
  return n;
}

int64_t head_bytes(const arch::AttentionShape& attention, int64_t window, const MemoryOptions& o) {
  return checked_mul(o.batch, kv_bytes(global_head_slots(window, o), 1, attention.head_dim, o));
}

MemoryEstimate estimate(const arch::ModelSpec& spec, const HeadWindows& windows,
                        const MemoryOptions& options) {
  return estimate(spec, windows, options, {});
}

int64_t selection_bytes(const arch::AttentionShape& attention, const std::vector<int64_t>& windows,
                        const MemoryOptions& options) {
  HEADWISE_CHECK(static_cast<int64_t>(windows.size()) == attention.num_kv_heads,
                 "{} windows for {} KV heads", windows.size(), attention.num_kv_heads);
  constexpr int64_t kPerSlot = sizeof(int64_t) + sizeof(float);  // position, keep score
  constexpr int64_t kPerHead = 3 * sizeof(int64_t);              // region offset, length, fill
  int64_t slots = 0;
  for (int64_t w : windows) slots = checked_add(slots, global_head_slots(w, options));
  return checked_mul(options.batch, checked_add(checked_mul(slots, kPerSlot),
                                                checked_mul(attention.num_kv_heads, kPerHead)));
}

MemoryEstimate estimate(const arch::ModelSpec& spec, const HeadWindows& windows,
                        const MemoryOptions& options, const std::set<int64_t>& selecting) {
  validate_options(options);
  for (int64_t id : selecting) {
    if (id < 0 || id >= spec.num_layers() || !spec.layer(id).is_global()) {
      throw_input_error("layer {} selects tokens but is not a global attention layer", id);
    }
  }
  validate_windows(spec, windows);
  MemoryEstimate out;
  out.options = options;
  for (const auto& layer : spec.layers) {
    LayerMemory lm;
    lm.layer_id = layer.id;
    lm.kind = layer.kind;
    const std::vector<int64_t>* heads = nullptr;
    if (layer.is_global()) {
      heads = &windows.at(layer.id);
      lm.kv_head_windows = *heads;
    }
    lm.kv_bytes = checked_mul(options.batch, layer_kv_bytes_per_sequence(layer, heads, options));
    (layer.is_global() ? out.components.global_kv_bytes : out.components.local_kv_bytes) +=
        lm.kv_bytes;
    for (const auto& state : layer.states) {
      const int64_t bytes = checked_mul(options.batch, state_bytes_per_sequence(state, options));
      lm.state_bytes = checked_add(lm.state_bytes, bytes);
      component_of(out.components, state.state_class) += bytes;
    }
    if (selecting.contains(layer.id)) {
      lm.selection_bytes = selection_bytes(*layer.attention, *heads, options);
      out.components.selection_state_bytes =
          checked_add(out.components.selection_state_bytes, lm.selection_bytes);
    }
    lm.bytes = checked_add(checked_add(lm.kv_bytes, lm.state_bytes), lm.selection_bytes);
    out.total_bytes = checked_add(out.total_bytes, lm.bytes);
    out.layers.push_back(std::move(lm));
  }
  HEADWISE_CHECK(out.total_bytes == out.components.total(), "components do not add up");
  return out;
}

int64_t full_kv_bytes(const arch::ModelSpec& spec, const MemoryOptions& options) {
  return estimate(spec, full_kv_windows(spec), options).total_bytes;
}

int64_t fixed_bytes(const arch::ModelSpec& spec, const MemoryOptions& options) {
  const MemoryEstimate e = estimate(spec, full_kv_windows(spec), options);
  return e.total_bytes - e.components.global_kv_bytes;
}

Capacity capacity_search(const TotalBytes& total_bytes, const MemoryOptions& options,
                         int64_t cache_budget_bytes, int64_t context_limit) {
  validate_options(options);
  Capacity out;
  if (cache_budget_bytes <= 0) {
    out.max_context = 0;
    return out;
  }
  const auto fits_at = [&](int64_t context) {
    MemoryOptions o = options;
    o.context = context;
    try {
      return total_bytes(o) <= cache_budget_bytes;
    } catch (const InputError&) {  // past 2^63 bytes: certainly does not fit
      return false;
    }
  };
  if (fits_at(context_limit)) {
    out.max_context = std::nullopt;
  } else if (!fits_at(1)) {
    out.max_context = 0;
  } else {
    int64_t lo = 1, hi = context_limit;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits_at(mid) ? lo : hi) = mid;
    }
    out.max_context = lo;
  }
  MemoryOptions one = options;
  one.batch = 1;
  const int64_t per_sequence = total_bytes(one);
  out.max_batch = per_sequence == 0 ? 0 : cache_budget_bytes / per_sequence;
  return out;
}

Capacity capacity(const arch::ModelSpec& spec, const HeadWindows& windows,
                  const MemoryOptions& options, int64_t cache_budget_bytes, int64_t context_limit,
                  const std::set<int64_t>& selecting) {
  return capacity_search(
      [&](const MemoryOptions& o) { return estimate(spec, windows, o, selecting).total_bytes; },
      options, cache_budget_bytes, context_limit);
}

}  // namespace headwise::memory
